"""dpo: direct preference optimization of the SFT policy on the reward model's comparisons.

No reward model and no sampling: the policy starts as the SFT model, which is also the
frozen reference, so the reference's log-probs of every distinct response are computed once,
before training, and no second model is kept. Each step takes `dpo.batch_size` prompts,
forwards each distinct response once and averages the loss over all their ranked pairs, every
prompt weighing the same (as the reward model's K-way loss does). Resumable like SFT and the
reward model.

Metrics: how the implicit reward beta * (log pi - log pi_ref) orders held-out comparisons
(against the noisy labels and the gold order, with the reward model's metric names), its
margin, and how the log-probs of chosen and rejected answers moved: DPO is known to lower
both, and a chosen log-prob that falls far is a warning sign.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlhf import checkpoint
from rlhf.comparisons import EncodedGroup, encode_groups, response_lengths
from rlhf.data import COMPARISON_SCHEMA, read_rows
from rlhf.dpo import dpo_loss, sequence_logprobs
from rlhf.model import GPT
from rlhf.params import DPOParams, group_hash
from rlhf.reward import pad_examples, ranking_pairs
from rlhf.reward_metrics import comparison_metrics
from rlhf.tokenizer import load_tokenizer
from rlhf.trainer import fit
from rlhf.training import autocast, resolve_device
from stages import paths
from stages.common import console, file_digest, params, progress, publish_training

RESUME_FILE = paths.RESUME / "dpo.pt"
PARAM_GROUPS = ("seed", "device", "dpo")


def group_logprobs(model: GPT, groups: list[EncodedGroup], pad_id: int) -> Tensor:
    """log pi of every distinct response of `groups`, in order [R]."""
    return sequence_logprobs(model, pad_examples([e for g in groups for e in g.examples], pad_id))


@torch.no_grad()
def all_logprobs(
    model: GPT, groups: list[EncodedGroup], pad_id: int, chunk: int, bf16: bool = False
) -> list[Tensor]:
    """Per group, log pi of its distinct responses; `chunk` groups per forward.

    `bf16` computes them under the training steps' autocast: the reference log-probs of the
    training pairs must come from the same precision as the policy's, or on CUDA every
    log-ratio starts off zero by the rounding difference and DPO fits that noise.
    """
    out = []
    with autocast(next(model.parameters()).device, bf16):
        for start in range(0, len(groups), chunk):
            part = groups[start : start + chunk]
            flat = group_logprobs(model, part, pad_id).cpu().split([len(g.examples) for g in part])
            out += list(flat)
    return out


def pair_loss(
    model: GPT,
    groups: list[EncodedGroup],
    reference: list[Tensor],
    pad_id: int,
    cfg: DPOParams,
) -> tuple[Tensor, dict[str, float], int]:
    """Loss over all ranked pairs of `groups`, what it measured, and the tokens forwarded."""
    logprobs = group_logprobs(model, groups, pad_id)  # [R]
    ratio = logprobs - torch.cat(reference).to(logprobs.device)
    pairs = ranking_pairs([g.ranks for g in groups], [g.rows for g in groups])
    better, worse = pairs.better.to(ratio.device), pairs.worse.to(ratio.device)
    weight = pairs.weight.to(ratio.device)
    losses = dpo_loss(
        ratio[better], ratio[worse], beta=cfg.beta, loss=cfg.loss,
        label_smoothing=cfg.label_smoothing,
    )  # fmt: skip
    with torch.no_grad():  # statistics over pairs of two different answers
        distinct = weight * (better != worse)
        distinct = distinct / distinct.sum().clamp(min=1e-12)
        margin = cfg.beta * (ratio[better] - ratio[worse])
        stats = {
            "reward_accuracy": float((distinct * (margin > 0)).sum()),
            "reward_margin": float((distinct * margin).sum()),
            "chosen_logp": float((distinct * logprobs[better]).sum()),
            "rejected_logp": float((distinct * logprobs[worse]).sum()),
        }
    tokens = sum(g.tokens for g in groups)
    return (weight * losses).sum(), stats, tokens


def run() -> dict[str, Any]:
    p = params()
    cfg = p.dpo
    torch.manual_seed(p.seed)
    device = resolve_device(p.device)
    tokenizer = load_tokenizer(paths.TOKENIZER)
    train = read_rows(paths.COMPARISONS_TRAIN, COMPARISON_SCHEMA)
    val = read_rows(paths.COMPARISONS_VAL, COMPARISON_SCHEMA)
    policy, _ = checkpoint.load_model(paths.SFT_MODEL, tokenizer, device)
    pad = tokenizer.pad_id
    train_groups = encode_groups(tokenizer, train, policy.config.block_size)
    val_groups = encode_groups(tokenizer, val, policy.config.block_size)
    chunk = cfg.eval_batch_size
    # the reference is the SFT model: the policy before its first step (a resumed run loads its
    # trained weights only inside `fit`), so no second copy is kept. Training steps run under
    # autocast, validation in full precision; each reference matches the forwards it meets.
    train_reference = all_logprobs(policy, train_groups, pad, chunk, bf16=cfg.bf16)
    val_reference = all_logprobs(policy, val_groups, pad, chunk)
    console.print(f"dpo: {len(train)} prompts, reference log-probs of every response computed")

    def validation() -> dict[str, float]:
        totals: dict[str, float] = {}
        for start in range(0, len(val_groups), chunk):
            part = slice(start, start + chunk)
            loss, stats, _ = pair_loss(policy, val_groups[part], val_reference[part], pad, cfg)
            share = len(val_groups[part]) / len(val_groups)
            for key, value in {"val_loss": loss.item(), **stats}.items():
                totals[key] = totals.get(key, 0.0) + value * share
        return totals

    last_batch: dict[str, float] = {}

    def batch_loss(indices: list[int]) -> tuple[Tensor, int]:
        loss, stats, tokens = pair_loss(
            policy, [train_groups[i] for i in indices], [train_reference[i] for i in indices],
            pad, cfg,
        )  # fmt: skip
        last_batch.update(stats)
        return loss, tokens

    fingerprint = group_hash(p, *PARAM_GROUPS) + file_digest(
        paths.COMPARISONS_TRAIN, paths.COMPARISONS_VAL, paths.SFT_MODEL
    )
    with progress() as bar:
        task = bar.add_task("dpo", total=None, extra="")
        history = fit(
            policy,
            cfg,
            seed=p.seed,
            n_examples=len(train),
            lengths=[g.tokens for g in train_groups],
            batch_loss=batch_loss,
            evaluate=validation,
            device=device,
            resume_file=RESUME_FILE,
            fingerprint=fingerprint,
            fresh_extra=validation,  # the same measures for the SFT policy, before training
            step_stats=lambda: dict(last_batch),
            on_step=lambda step, total, loss: bar.update(
                task,
                completed=step,
                total=total,
                extra=f"loss {loss:.3f} acc {last_batch['reward_accuracy']:.2f}",
            ),
            log=lambda line: console.print(f"dpo: {line}"),
        )

    implicit = [  # per ranked response of each held-out prompt
        [cfg.beta * float(logp[i] - ref[i]) for i in g.rows]
        for g, logp, ref in zip(
            val_groups, all_logprobs(policy, val_groups, pad, chunk), val_reference, strict=True
        )
    ]
    final, sft = history.epochs[-1], history.extra
    metrics = {
        **comparison_metrics(val, implicit, response_lengths(tokenizer, val)),
        "val_loss": round(final["val_loss"], 6),
        "reward_accuracy": round(final["reward_accuracy"], 4),
        "reward_margin": round(final["reward_margin"], 4),
        "chosen_logp": round(final["chosen_logp"], 4),
        "rejected_logp": round(final["rejected_logp"], 4),
        "chosen_logp_sft": round(sft["chosen_logp"], 4),
        "rejected_logp_sft": round(sft["rejected_logp"], 4),
        "tokens_per_s": history.tokens_per_s,
        "steps": len(history.steps),
    }
    publish_training(
        model_file=paths.DPO_MODEL,
        payload=checkpoint.model_payload(
            policy, tokenizer, group_hash(p, *PARAM_GROUPS), kind="policy"
        ),
        history=history,
        steps_file=paths.DPO_STEPS,
        epochs_file=paths.DPO_EPOCHS,
        metrics_file=paths.DPO_METRICS,
        metrics=metrics,
        resume_file=RESUME_FILE,
    )
    console.print(
        f"dpo: implicit reward accuracy {metrics['reward_accuracy']} (gold "
        f"{metrics['acc_gold']}), margin {metrics['reward_margin']}, chosen log-prob "
        f"{metrics['chosen_logp']}, rejected {metrics['rejected_logp']}"
    )
    return metrics


if __name__ == "__main__":
    run()
