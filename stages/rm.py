"""rm: the reward model, trained on ranked comparisons with InstructGPT's K-way loss.

It starts from the SFT checkpoint (the LM head goes unused; the scalar reward head reads the
trunk) and trains on every C(K,2) pair of each prompt with each response forwarded once. After
training the head's bias is shifted so SFT demonstrations score 0 on average, and the reward's
std is recorded: PPO uses both to normalize rewards.
"""

from __future__ import annotations

from typing import Any

import torch

from rlhf import checkpoint
from rlhf.comparisons import EncodedGroup, encode_groups, response_lengths
from rlhf.data import COMPARISON_SCHEMA, SFT_SCHEMA, read_rows
from rlhf.model import GPT
from rlhf.params import Params, group_hash
from rlhf.reward import (
    normalize_head,
    pad_examples,
    pooled_rewards,
    ranking_loss,
    ranking_pairs,
    score,
)
from rlhf.reward_metrics import comparison_metrics
from rlhf.tokenizer import Tokenizer, load_tokenizer
from rlhf.trainer import fit
from rlhf.training import resolve_device
from stages import paths
from stages.common import console, file_digest, params, progress, publish_training

RESUME_FILE = paths.RESUME / "rm.pt"
PARAM_GROUPS = ("seed", "device", "rm")


def group_loss(
    model: GPT, groups: list[EncodedGroup], pad_id: int, pooling: str
) -> tuple[torch.Tensor, int]:
    """K-way loss of a batch of prompts: their responses in one forward, then all pairs."""
    batch = pad_examples([e for g in groups for e in g.examples], pad_id)
    rewards = pooled_rewards(model, batch, pooling)
    pairs = ranking_pairs([g.ranks for g in groups], [g.rows for g in groups])
    return ranking_loss(rewards, pairs), int(batch.lengths.sum())


@torch.no_grad()
def mean_group_loss(
    model: GPT, groups: list[EncodedGroup], pad_id: int, pooling: str, chunk: int
) -> float:
    """group_loss over a whole set, `chunk` prompts per forward (each prompt weighs the same)."""
    total = 0.0
    for start in range(0, len(groups), chunk):
        part = groups[start : start + chunk]
        total += group_loss(model, part, pad_id, pooling)[0].item() * len(part)
    return total / len(groups)


def row_rewards(
    model: GPT, tokenizer: Tokenizer, rows: list[dict[str, Any]], p: Params
) -> list[list[float]]:
    flat = score(
        model,
        tokenizer,
        [r["prompt"] for r in rows for _ in r["responses"]],
        [x for r in rows for x in r["responses"]],
        pooling=p.rm.pooling,
        batch_size=p.rm.eval_batch_size,
    ).tolist()
    out, offset = [], 0
    for r in rows:
        out.append(flat[offset : offset + len(r["responses"])])
        offset += len(r["responses"])
    return out


def run() -> dict[str, Any]:
    p = params()
    torch.manual_seed(p.seed)
    device = resolve_device(p.device)
    tokenizer = load_tokenizer(paths.TOKENIZER)
    train = read_rows(paths.COMPARISONS_TRAIN, COMPARISON_SCHEMA)
    val = read_rows(paths.COMPARISONS_VAL, COMPARISON_SCHEMA)
    model, _ = checkpoint.load_model(paths.SFT_MODEL, tokenizer, device)
    console.print(f"rm: {len(train)} prompts ({sum(len(r['ranks']) for r in train)} responses)")
    block, pad, pooling = model.config.block_size, tokenizer.pad_id, p.rm.pooling
    train_groups = encode_groups(tokenizer, train, block)
    val_groups = encode_groups(tokenizer, val, block)

    def evaluate() -> dict[str, float]:
        return {"val_loss": mean_group_loss(model, val_groups, pad, pooling, p.rm.batch_size)}

    fingerprint = group_hash(p, *PARAM_GROUPS) + file_digest(
        paths.COMPARISONS_TRAIN, paths.COMPARISONS_VAL, paths.SFT_MODEL
    )
    with progress() as bar:
        task = bar.add_task("rm", total=None, extra="")
        history = fit(
            model,
            p.rm,
            seed=p.seed,
            n_examples=len(train),
            lengths=[g.tokens for g in train_groups],
            batch_loss=lambda idx: group_loss(model, [train_groups[i] for i in idx], pad, pooling),
            evaluate=evaluate,
            device=device,
            resume_file=RESUME_FILE,
            fingerprint=fingerprint,
            on_step=lambda step, total, loss: bar.update(
                task, completed=step, total=total, extra=f"loss {loss:.3f}"
            ),
            log=lambda line: console.print(f"rm: {line}"),
        )

    demos = read_rows(paths.SFT_TRAIN, SFT_SCHEMA)[: p.rm.norm_samples]
    demo_rewards = score(
        model,
        tokenizer,
        [d["prompt"] for d in demos],
        [d["response"] for d in demos],
        pooling=p.rm.pooling,
        batch_size=p.rm.eval_batch_size,
    )
    shift, std = normalize_head(model, demo_rewards)
    metrics = {
        **comparison_metrics(
            val, row_rewards(model, tokenizer, val, p), response_lengths(tokenizer, val)
        ),
        "val_loss": round(history.epochs[-1]["val_loss"], 6),
        "reward_shift": round(shift, 6),
        "reward_std": round(std, 6),
        "tokens_per_s": history.tokens_per_s,
        "steps": len(history.steps),
    }
    publish_training(
        model_file=paths.RM_MODEL,
        payload=checkpoint.model_payload(
            model,
            tokenizer,
            group_hash(p, *PARAM_GROUPS),
            kind="reward",
            pooling=p.rm.pooling,
            reward_std=std,
        ),
        history=history,
        steps_file=paths.RM_STEPS,
        epochs_file=paths.RM_EPOCHS,
        metrics_file=paths.RM_METRICS,
        metrics=metrics,
        resume_file=RESUME_FILE,
    )
    console.print(
        f"rm: acc noisy {metrics['acc_noisy']}, gold {metrics['acc_gold']}, gold margin>=0.2 "
        f"{metrics['acc_gold_margin_ge_0_2']}, by margin {metrics['acc_gold_by_margin']}, "
        f"length corr {metrics['reward_length_corr']}"
    )
    return metrics


if __name__ == "__main__":
    run()
