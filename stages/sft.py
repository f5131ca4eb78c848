"""sft: supervised fine-tuning on demonstrations with prompt-masked cross-entropy.

Resumable through `rlhf.trainer.fit`: the resume file sits outside the stage's outs, which DVC
deletes before a rerun, and a resumed run ends with the same metrics as an uninterrupted one.
"""

from __future__ import annotations

from typing import Any

import torch

from rlhf import checkpoint
from rlhf.data import (
    IGNORE_INDEX,
    PROMPT_SCHEMA,
    SFT_SCHEMA,
    Example,
    collate,
    encode_example,
    read_rows,
)
from rlhf.evaluation import gold_summary
from rlhf.generation import SamplingConfig, generate_texts
from rlhf.model import GPT, GPTConfig
from rlhf.params import Params, group_hash
from rlhf.tokenizer import Tokenizer, load_tokenizer
from rlhf.trainer import fit
from rlhf.training import masked_lm_loss, resolve_device
from stages import paths
from stages.common import console, file_digest, params, progress, publish_training

RESUME_FILE = paths.RESUME / "sft.pt"
PARAM_GROUPS = ("seed", "device", "model", "sft")


@torch.no_grad()
def validation_loss(
    model: GPT, examples: list[Example], pad_id: int, batch_size: int, device: torch.device
) -> float:
    """Mean cross-entropy per response token over the whole set."""
    total, count = 0.0, 0
    for start in range(0, len(examples), batch_size):
        inputs, targets = collate(examples[start : start + batch_size], pad_id)
        inputs, targets = inputs.to(device), targets.to(device)
        tokens = int((targets != IGNORE_INDEX).sum())
        total += float(masked_lm_loss(model, inputs, targets)) * tokens
        count += tokens
    return total / count


def gold_eval(
    model: GPT, tokenizer: Tokenizer, heldout: list[dict[str, Any]], p: Params, greedy: bool
) -> dict[str, object] | None:
    """Gold-judged answers on held-out prompts; None when the data has no gold judge."""
    if any(row["source"] != "synthetic" for row in heldout):
        return None
    config = SamplingConfig(max_new_tokens=p.sft.eval_max_new_tokens, greedy=greedy)
    device = next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(p.seed)
    prompts = [row["prompt"] for row in heldout]
    answers = generate_texts(
        model, tokenizer, prompts, config, batch_size=p.sft.eval_batch_size, generator=generator
    )
    return gold_summary(prompts, [row["task"] for row in heldout], answers)


def run() -> dict[str, Any]:
    p = params()
    torch.manual_seed(p.seed)
    device = resolve_device(p.device)
    tokenizer = load_tokenizer(paths.TOKENIZER)
    block = p.model.block_size

    def encode(rows: list[dict[str, Any]]) -> list[Example]:
        return [encode_example(tokenizer, r["prompt"], r["response"], block) for r in rows]

    train = encode(read_rows(paths.SFT_TRAIN, SFT_SCHEMA))
    val = encode(read_rows(paths.SFT_VAL, SFT_SCHEMA))
    heldout = read_rows(paths.PROMPTS_HELDOUT, PROMPT_SCHEMA)
    model = GPT(
        GPTConfig(
            vocab_size=tokenizer.vocab_size,
            block_size=block,
            n_layer=p.model.n_layer,
            n_head=p.model.n_head,
            n_embd=p.model.n_embd,
            mlp_width=p.model.mlp_width,
            dropout=p.model.dropout,
            bias=p.model.bias,
        )
    ).to(device)
    console.print(
        f"sft: {model.num_params() / 1e6:.2f}M parameters, {len(train)} demonstrations on {device}"
    )

    def batch_loss(indices: list[int]) -> tuple[torch.Tensor, int]:
        inputs, targets = (
            t.to(device) for t in collate([train[i] for i in indices], tokenizer.pad_id)
        )
        return masked_lm_loss(model, inputs, targets), int((inputs != tokenizer.pad_id).sum())

    fingerprint = group_hash(p, *PARAM_GROUPS) + file_digest(
        paths.SFT_TRAIN, paths.SFT_VAL, paths.PROMPTS_HELDOUT, paths.TOKENIZER / "tokenizer.json"
    )
    with progress() as bar:
        task = bar.add_task("sft", total=None, extra="")
        history = fit(
            model,
            p.sft,
            seed=p.seed,
            n_examples=len(train),
            batch_loss=batch_loss,
            evaluate=lambda: {
                "val_loss": validation_loss(model, val, tokenizer.pad_id, p.sft.batch_size, device)
            },
            device=device,
            resume_file=RESUME_FILE,
            fingerprint=fingerprint,
            fresh_extra=lambda: {"untrained": gold_eval(model, tokenizer, heldout, p, greedy=True)},
            on_step=lambda step, total, loss: bar.update(
                task, completed=step, total=total, extra=f"loss {loss:.3f}"
            ),
            log=lambda line: console.print(f"sft: {line}"),
        )

    greedy = gold_eval(model, tokenizer, heldout, p, greedy=True)
    sampled = gold_eval(model, tokenizer, heldout, p, greedy=False)
    untrained = history.extra["untrained"]
    metrics = {
        "val_loss": round(history.epochs[-1]["val_loss"], 6),
        "train_loss": round(history.epochs[-1]["train_loss"], 6),
        "gold_greedy": greedy and greedy["mean"],
        "gold_sampled": sampled and sampled["mean"],
        "gold_greedy_untrained": untrained and untrained["mean"],
        "gold_greedy_by_task": greedy and greedy["by_task"],
        "gold_sampled_by_task": sampled and sampled["by_task"],
        "tokens_per_s": history.tokens_per_s,
        "steps": len(history.steps),
        "params": model.num_params(),
    }
    publish_training(
        model_file=paths.SFT_MODEL,
        payload=checkpoint.model_payload(
            model, tokenizer, group_hash(p, *PARAM_GROUPS), kind="policy"
        ),
        history=history,
        steps_file=paths.SFT_STEPS,
        epochs_file=paths.SFT_EPOCHS,
        metrics_file=paths.SFT_METRICS,
        metrics=metrics,
        resume_file=RESUME_FILE,
    )
    console.print(
        f"sft: val loss {metrics['val_loss']}, gold greedy {metrics['gold_greedy']} "
        f"(untrained {metrics['gold_greedy_untrained']}), sampled {metrics['gold_sampled']}, "
        f"{metrics['tokens_per_s']} tokens/s"
    )
    return metrics


if __name__ == "__main__":
    run()
