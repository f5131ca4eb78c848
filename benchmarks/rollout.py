"""Rollout throughput: the batched KV-cache sampler against the seed notebook's loop.

Generated tokens per second for batch 1, 16 and 64 (prompt 16 tokens, 64 new tokens, top-p
0.9, temperature 1), at the default model size and at the seed notebook's size (4 layers,
width 128, MLP 2048) with vocabularies of 260 and 4096. Random weights: their nearly flat
distributions make top-p keep about 90% of the vocabulary, the worst case for nucleus sampling.
The naive reference is the seed's sampler: batch 1, no KV cache, a full forward per token. The
peer is Hugging Face `generate` on the same weights (exported as a GPT-2 folder), run in this
same process at batch 64 with the vocabulary of 4096, where the sampler must beat it.

Also reported: the share of each decoding step spent choosing the token (temperature, exact
top-p, the draw), measured on the same logits.

    python benchmarks/rollout.py [--threads 2] [--out benchmarks/results/rollout.json]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
import transformers  # the [hf] extra: Hugging Face generate runs beside the sampler
from common import setup, write_result

from rlhf.models.gpt import GPT, GPTConfig
from rlhf.models.hf import save_folder
from rlhf.sampling.generate import generate
from rlhf.sampling.sampler import SamplingConfig, choose_from_probs, draws_per_step

PROMPT_TOKENS = 16
NEW_TOKENS = 64
TOP_P = 0.9
SIZES = {
    "default (4x128, mlp 512, vocab 2048)": GPTConfig(vocab_size=2048, block_size=96),
    "seed (4x128, mlp 2048, vocab 260)": GPTConfig(vocab_size=260, block_size=96, mlp_width=2048),
    "seed (4x128, mlp 2048, vocab 4096)": GPTConfig(vocab_size=4096, block_size=96, mlp_width=2048),
}
BATCHES = (1, 16, 64)
PEER = ("seed (4x128, mlp 2048, vocab 4096)", 64)  # where Hugging Face generate runs beside us


def best_of(runs: int, fn) -> float:
    """Median seconds of `runs` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@torch.no_grad()
def naive_loop(model: GPT, prompt: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The seed notebook's sampler: one sequence, the whole prefix forwarded for every token,
    a full sort for top-p, then multinomial."""
    ids = prompt
    for _ in range(NEW_TOKENS):
        logits = model(ids)[:, -1]
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= TOP_P
        sorted_logits[drop] = float("-inf")
        choice = torch.multinomial(sorted_logits.softmax(-1), 1, generator=generator)
        ids = torch.cat([ids, order.gather(-1, choice)], dim=1)
    return ids


def engine(model: GPT, prompts: torch.Tensor, generator: torch.Generator) -> None:
    vocab = model.config.vocab_size
    generate(
        model,
        prompts.tolist(),
        eos_id=-1,  # never stops early: every row decodes all NEW_TOKENS
        pad_id=vocab - 1,
        config=SamplingConfig(max_new_tokens=NEW_TOKENS, top_p=TOP_P),
        generator=generator,
    )


def sampling_seconds(model: GPT, batch: int, generator: torch.Generator) -> float:
    """Seconds per decoding step spent turning logits into tokens (filter + draw), from
    uniforms drawn up front as a generation draws them."""
    vocab = model.config.vocab_size
    logits = model(torch.randint(0, vocab, (batch, PROMPT_TOKENS)))[:, -1]

    config = SamplingConfig(top_p=TOP_P)
    table = torch.rand(NEW_TOKENS, batch, draws_per_step(config, vocab), generator=generator)

    def choose() -> None:
        for step in range(NEW_TOKENS):
            choose_from_probs(logits.float().softmax(-1), config, table[step])

    return best_of(3, choose) / NEW_TOKENS


@torch.no_grad()
def hf_generate_tokens_per_s(model: GPT, batch: int) -> int:
    """Tokens per second of Hugging Face `generate` on `model`'s weights, sampling as the
    sampler does (temperature 1, top-p, no top-k, every answer NEW_TOKENS long)."""
    with tempfile.TemporaryDirectory() as tmp:
        peer = transformers.GPT2LMHeadModel.from_pretrained(save_folder(model, Path(tmp) / "m"))
    prompts = torch.randint(0, model.config.vocab_size - 1, (batch, PROMPT_TOKENS))
    run = partial(
        peer.eval().generate, prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
        top_p=TOP_P, top_k=0, temperature=1.0, max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS, pad_token_id=model.config.vocab_size - 1,
    )  # fmt: skip
    return round(batch * NEW_TOKENS / best_of(3, run))


def targets(rows: list[dict]) -> list[dict]:
    """The PPO issue's speed targets, checked against this run: 50x the naive loop, and faster
    than Hugging Face `generate` measured beside it."""
    checks = []
    for r in rows:
        if r["batch"] == 64:
            checks.append(
                {
                    "target": f"{r['model']}, batch 64: >= 50x the naive loop",
                    "value": r["speedup_vs_naive"],
                    "met": r["speedup_vs_naive"] >= 50,
                }
            )
        if "hf_generate_tokens_per_s" in r:
            checks.append(
                {
                    "target": f"{r['model']}, batch {r['batch']}: faster than HF generate "
                    f"({r['hf_generate_tokens_per_s']} tok/s in this run)",
                    "value": r["tokens_per_s"],
                    "met": r["tokens_per_s"] > r["hf_generate_tokens_per_s"],
                }
            )
    worst = max(r["sampling_share"] for r in rows)
    checks.append(
        {"target": "sampling < 50% of every decoding step", "value": worst, "met": worst < 0.5}
    )
    return checks


def main() -> None:
    args = setup(__doc__, "rollout")
    generator = torch.Generator().manual_seed(0)
    rows = []
    for name, config in SIZES.items():
        model = GPT(config).eval()
        prompt = torch.randint(0, config.vocab_size - 1, (1, PROMPT_TOKENS))
        naive = NEW_TOKENS / best_of(2, partial(naive_loop, model, prompt, generator))
        for batch in BATCHES:
            prompts = torch.randint(0, config.vocab_size - 1, (batch, PROMPT_TOKENS))
            seconds = best_of(3, partial(engine, model, prompts, generator))
            step = seconds / NEW_TOKENS
            rows.append(
                {
                    "model": name,
                    "batch": batch,
                    "tokens_per_s": round(batch * NEW_TOKENS / seconds),
                    "naive_tokens_per_s": round(naive),
                    "speedup_vs_naive": round(batch * NEW_TOKENS / seconds / naive, 1),
                    "ms_per_step": round(step * 1000, 2),
                    "sampling_share": round(sampling_seconds(model, batch, generator) / step, 3),
                }
            )
            if (name, batch) == PEER:
                rows[-1]["hf_generate_tokens_per_s"] = hf_generate_tokens_per_s(model, batch)
    columns = ("batch", "tok/s", "naive", "x naive", "ms/step", "sampling")
    print(f"{'model':38} " + " ".join(f"{c:>8}" for c in columns))
    for r in rows:
        print(
            f"{r['model']:38} {r['batch']:>8} {r['tokens_per_s']:>8} {r['naive_tokens_per_s']:>8} "
            f"{r['speedup_vs_naive']:>8} {r['ms_per_step']:>8} {r['sampling_share']:>8.0%}"
        )
    checks = targets(rows)
    for check in checks:
        print(f"{'met' if check['met'] else 'NOT met':>8}  {check['target']}: {check['value']}")
    write_result(args.out, {"threads": args.threads, "rows": rows, "targets": checks})


if __name__ == "__main__":
    main()
