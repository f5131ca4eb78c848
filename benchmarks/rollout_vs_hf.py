"""Rollout tokens/s: the pipeline's sampler against Hugging Face `generate`, same model and weights.

One GPT-2 folder with random weights at GPT-2 124M's shape (`gpt2_shape.py`) is loaded twice:
by the pipeline as it loads a user's GPT-2 (`load_folder`) and by `transformers`
(`GPT2LMHeadModel.from_pretrained`). Both sample 128 new tokens after the same left-padded
prompts (16 to 48 random tokens) at temperature 1 from the whole distribution (HF: `top_k=0`,
`top_p=1`), at batch 64 and 256, with the KV cache, on the weights cast to each `--dtypes`
(bfloat16 is how the pipeline holds sampling-only models on CUDA, `memory.frozen_bf16`;
the RL stages' policy samples in float32, its training weights).
Random weights almost never emit the end token, and HF is held to exactly 128 tokens
(`min_new_tokens`), so both do batch x 128 decoding steps' work. The pipeline draws from a
seeded stream per row (`RowStreams`), as its RL rollouts do.

The pipeline runs twice: its decoding steps one op at a time (`RLHF_DECODE=eager`, the
reference) and compiled (`compiled`; on CUDA `graph`: captured as CUDA graphs and replayed,
what the stages run there). From the same streams in float32 both must give the same
log-probs up to float rounding until a row's first different token (a draw within rounding of
a boundary between two of 50257 near-uniform tokens), and at least half the rows identical.

Before timing, one check that the two really hold the same model: their float32 logits on
the prompts agree, and greedy decoding gives the same tokens (float32, 4 prompts, 16 tokens).

    python benchmarks/rollout_vs_hf.py --device cuda [--batches 64,256] [--dtypes bfloat16,float32]
    python benchmarks/rollout_vs_hf.py --shape tiny --batches 8 --new-tokens 16   # CPU smoke run
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from common import DEVICE_OPTION, device_name, setup, synchronize, write_result
from gpt2_shape import SHAPE_OPTION, SHAPES, random_gpt2_folder

from rlhf.data.batching import left_pad
from rlhf.models.backbone import Backbone
from rlhf.models.hf import load_folder
from rlhf.sampling.generate import Generation, generate
from rlhf.sampling.sampler import SamplingConfig
from rlhf.sampling.streams import RowStreams

TARGET_SPEEDUP = 4.0  # the compiled sampler against HF generate, at batch 64
TARGET_TOKENS_PER_S = {64: 64_000, 256: 200_000}  # the compiled sampler's, on an H100/H200
PROMPT_TOKENS = (16, 48)
# float32 log-probs of the compiled steps against the eager ones while their tokens agree:
# float rounding (the compiled attention sums over the whole cache buffer), far below a bug's
COMPILED_LOGPROB_GAP = 1e-3
ENGINES = ("eager", "compiled", "hf_generate")


def random_prompts(count: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(*PROMPT_TOKENS, (count,), generator=generator).tolist()
    return [torch.randint(0, vocab - 1, (n,), generator=generator).tolist() for n in lengths]


def median_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def compiled_mode(device: torch.device) -> str:
    """What the stages run on `device` when compiled: CUDA graphs on CUDA."""
    return "graph" if device.type == "cuda" else "compiled"


def pipeline_sampler(
    model: Backbone,
    prompts: list[list[int]],
    end: int,
    new_tokens: int,
    greedy: bool = False,
    mode: str = "eager",
) -> Callable[[], Generation]:
    """The pipeline's sampler as the RL stages run it, a seeded stream per row, ready to
    call (and time)."""
    config = SamplingConfig(max_new_tokens=new_tokens, greedy=greedy)

    def sample() -> Generation:
        os.environ["RLHF_DECODE"] = mode
        streams = RowStreams(list(range(len(prompts))))
        return generate(model, prompts, eos_id=end, pad_id=end, config=config, generator=streams)

    return sample


def compiled_against_eager(
    model: Backbone, vocab: int, end: int, new_tokens: int
) -> dict[str, float | int]:
    """The compiled sampler against the eager one from the same streams, float32: rows whose
    tokens are identical, and the largest log-prob gap before each row's first different token.
    Over GPT-2's 50257 near-uniform tokens of a random model a draw now and then lands within
    float rounding of a boundary and the row goes its own way from there; a wrong sampler shows
    as a log-prob gap."""
    prompts = random_prompts(16, vocab, seed=2)
    mode = compiled_mode(next(model.parameters()).device)
    eager = pipeline_sampler(model, prompts, end, new_tokens)()
    compiled = pipeline_sampler(model, prompts, end, new_tokens, mode=mode)()
    differs = compiled.tokens != eager.tokens  # [B, N]
    before_first = differs.long().cumsum(-1) == 0  # [B, N] up to each row's first difference
    gap = (compiled.logprobs - eager.logprobs).abs()[before_first & eager.mask]
    return {
        "compiled_rows_identical": int((~differs.any(-1)).sum()),
        "compiled_rows": len(prompts),
        "compiled_logprob_gap": float(gap.max()) if gap.numel() else 0.0,
    }


def hf_sampler(
    model: transformers.GPT2LMHeadModel,
    prompts: list[list[int]],
    end: int,
    new_tokens: int,
    greedy: bool = False,
) -> Callable[[], torch.Tensor]:
    ids, mask = left_pad(prompts, end)
    ids, mask = ids.to(model.device), mask.to(model.device).long()
    options = {"do_sample": False} if greedy else {"do_sample": True, "top_k": 0, "top_p": 1.0}
    return lambda: model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, pad_token_id=end,
        eos_token_id=end, min_new_tokens=0 if greedy else new_tokens, temperature=1.0,
        **options,
    )[:, ids.shape[1] :]  # fmt: skip


def same_model_check(ours: Backbone, theirs, vocab: int, end: int) -> dict[str, float | bool]:
    """float32: the largest logit difference relative to the logits' scale, and whether
    greedy decoding of 4 prompts for 16 tokens gives the same tokens."""
    prompts = random_prompts(4, vocab, seed=1)
    ids, mask = left_pad(prompts, end)
    ids, mask = ids.to(theirs.device), mask.to(theirs.device)
    with torch.no_grad():
        our_logits = ours(ids, mask)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        their_logits = theirs(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    real = mask[..., None].expand_as(our_logits)
    difference = (our_logits - their_logits)[real].abs().max() / their_logits[real].abs().max()
    greedy_ours = pipeline_sampler(ours, prompts, end, 16, greedy=True)().tokens
    greedy_theirs = hf_sampler(theirs, prompts, end, 16, greedy=True)()
    return {
        "max_logit_difference_relative": float(difference),
        "greedy_tokens_identical": bool(torch.equal(greedy_ours, greedy_theirs)),
    }


def main() -> None:
    args = setup(
        __doc__,
        "rollout_vs_hf",
        DEVICE_OPTION,
        SHAPE_OPTION,
        ("--batches", {"default": "64,256"}),
        ("--dtypes", {"default": None, "help": "default: bfloat16,float32 on cuda, else float32"}),
        ("--new-tokens", {"type": int, "default": 128}),
        ("--repeats", {"type": int, "default": 3}),
    )
    device, shape = torch.device(args.device), SHAPES[args.shape]
    dtypes = args.dtypes or ("bfloat16,float32" if device.type == "cuda" else "float32")
    end = shape.end_id
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = random_gpt2_folder(Path(tmp), shape)
        ours = load_folder(folder, device).eval()
        theirs = transformers.GPT2LMHeadModel.from_pretrained(folder).to(device).eval()
        check = same_model_check(ours, theirs, shape.vocab_size, end)
        check |= compiled_against_eager(ours, shape.vocab_size, end, args.new_tokens)
        print(
            f"same model: float32 logits within {check['max_logit_difference_relative']:.1e} "
            f"relative, greedy tokens identical: {check['greedy_tokens_identical']}; compiled "
            f"sampler against the eager one (float32): {check['compiled_rows_identical']} of "
            f"{check['compiled_rows']} rows identical, log-probs within "
            f"{check['compiled_logprob_gap']:.1e} up to each row's first different token"
        )
        samplers = {
            "eager": lambda model, prompts: pipeline_sampler(model, prompts, end, args.new_tokens),
            "compiled": lambda model, prompts: pipeline_sampler(
                model, prompts, end, args.new_tokens, mode=compiled_mode(device)
            ),
            "hf_generate": lambda model, prompts: hf_sampler(model, prompts, end, args.new_tokens),
        }
        for dtype_name in dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            ours.to(dtype)
            theirs.to(dtype)
            for batch in (int(b) for b in args.batches.split(",")):
                prompts = random_prompts(batch, shape.vocab_size, seed=batch)
                seconds = {
                    engine: median_seconds(
                        samplers[engine](theirs if engine == "hf_generate" else ours, prompts),
                        device,
                        args.repeats,
                    )
                    for engine in ENGINES
                }
                tokens = batch * args.new_tokens
                rows.append(
                    {
                        "dtype": dtype_name,
                        "batch": batch,
                        "new_tokens": args.new_tokens,
                        **{f"{k}_tokens_per_s": round(tokens / s) for k, s in seconds.items()},
                        **{
                            f"{k}_ms_per_step": round(1e3 * s / args.new_tokens, 3)
                            for k, s in seconds.items()
                        },
                        "speedup": round(seconds["hf_generate"] / seconds["compiled"], 2),
                    }
                )
    print(
        f"{'dtype':9} {'batch':>6} {'eager tok/s':>12} {'compiled tok/s':>15} {'ms/step':>8} "
        f"{'HF tok/s':>10} {'vs HF':>6}"
    )
    for r in rows:
        print(
            f"{r['dtype']:9} {r['batch']:>6} {r['eager_tokens_per_s']:>12} "
            f"{r['compiled_tokens_per_s']:>15} {r['compiled_ms_per_step']:>8.2f} "
            f"{r['hf_generate_tokens_per_s']:>10} {r['speedup']:>6.2f}"
        )
    same = check["greedy_tokens_identical"] and check["max_logit_difference_relative"] < 1e-4
    targets = [
        {
            "target": f"compiled, {r['dtype']}, batch {r['batch']}: >= "
            f"{TARGET_TOKENS_PER_S[r['batch']]} tokens/s and (batch 64) >= {TARGET_SPEEDUP}x HF",
            "met": r["compiled_tokens_per_s"] >= TARGET_TOKENS_PER_S[r["batch"]]
            and (r["batch"] != 64 or r["speedup"] >= TARGET_SPEEDUP),
        }
        for r in rows
        if r["batch"] in TARGET_TOKENS_PER_S
    ]
    sampler_right = (
        check["compiled_logprob_gap"] < COMPILED_LOGPROB_GAP
        and check["compiled_rows_identical"] * 2 >= check["compiled_rows"]
    )
    met = same and sampler_right and all(t["met"] for t in targets)
    if not same:
        print("NOT the same model: the comparison is void")
    for t in targets:
        print(f"{'met' if t['met'] else 'NOT met'}: {t['target']}")
    write_result(
        args.out,
        {
            "device": device_name(device),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "shape": args.shape,
            "same_model": check,
            "rows": rows,
            "targets": targets,
            "target_met": met,
        },
    )
    if not sampler_right:
        print(
            "NOT the eager sampler: fewer than half the rows identical, or log-probs "
            f"{check['compiled_logprob_gap']:.1e} apart"
        )
    if not same or not sampler_right:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
