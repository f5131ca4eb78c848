"""dpo: direct preference optimization of the SFT policy on the reward model's comparisons.

No reward model and no sampling: the policy starts as the SFT model, which is also the frozen
reference, so the reference's log-probs of every distinct response are computed once, before
training, and no second model is kept. Dropout stays off, so every log-ratio starts at exactly
zero. Resumable like SFT and the reward model.

Metrics: how the implicit reward beta * (log pi - log pi_ref) orders held-out comparisons
(against the noisy labels and the gold order, with the reward model's metric names), its
margin, and how the log-probs of chosen and rejected answers moved: DPO is known to lower
both, and a chosen log-prob that falls far is a warning sign.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from rlhf.algorithms.dpo import all_logprobs, implicit_rewards, mean_pair_loss, pair_loss
from rlhf.data.comparisons import EncodedGroup, encode_groups, paired, response_lengths
from rlhf.data.schemas import COMPARISON_SCHEMA, read_rows
from rlhf.eval.rm_accuracy import comparison_metrics
from rlhf.models.backbone import Backbone
from rlhf.params.groups import DPOParams
from rlhf.project import paths
from rlhf.project.specs import MODEL_HEADLINE, StageSpec, trained_outputs
from rlhf.stages.support import fitting
from rlhf.stages.support.context import StageRun
from rlhf.stages.support.entry import main
from rlhf.train.loop import History, Objective

LOGPS = ("chosen_logp", "rejected_logp")

SPEC = StageSpec(
    "dpo",
    "rlhf.stages.dpo",
    params=("seed", "device", "threads", "cpu_kernels", "memory", "train", "dpo"),
    inputs=(paths.COMPARISONS_TRAIN, paths.COMPARISONS_VAL, paths.TOKENIZER, paths.SFT_MODEL),
    **trained_outputs("dpo", MODEL_HEADLINE),
)


def summary(history: History) -> dict[str, Any]:
    """The last epoch's validation measures, and the chosen and rejected log-probs of the SFT
    policy before training (fresh_extra)."""
    final, sft = history.epochs[-1], history.extra
    return {
        "val_loss": round(final["val_loss"], 6),
        **{k: round(final[k], 4) for k in ("reward_accuracy", "reward_margin", *LOGPS)},
        **{f"{k}_sft": round(sft[k], 4) for k in LOGPS},
        "steps": len(history.steps),
    }


def reference_logprobs(
    policy: Backbone,
    train: list[EncodedGroup],
    val: list[EncodedGroup],
    pad: int,
    cfg: DPOParams,
) -> tuple[list[Tensor], list[Tensor]]:
    """The reference's log-probs of every response, train and validation. The reference is
    the SFT model: the policy before its first step (a resumed run loads its trained weights
    only inside `fit`), so no second copy is kept. Training steps run under autocast,
    validation in full precision; each reference matches the forwards it meets."""
    chunk = cfg.eval_batch_size
    return (
        all_logprobs(policy, train, pad, chunk, bf16=cfg.bf16),
        all_logprobs(policy, val, pad, chunk),
    )


def run() -> dict[str, Any]:
    stage = StageRun.start(SPEC)
    cfg, tokenizer, pad = stage.params.dpo, stage.tokenizer, stage.tokenizer.pad_id
    train = read_rows(paths.COMPARISONS_TRAIN, COMPARISON_SCHEMA)
    val = read_rows(paths.COMPARISONS_VAL, COMPARISON_SCHEMA)
    widest = max(len(r["responses"]) for r in train + val)
    stage.preflight(paths.SFT_MODEL, stage.workload(sequences=cfg.batch_size * widest))
    policy = stage.load_model(paths.SFT_MODEL)
    train_groups, val_groups = (
        encode_groups(tokenizer, rows, policy.max_seq_len) for rows in (train, val)
    )
    chunk = cfg.eval_batch_size
    train_reference, val_reference = reference_logprobs(policy, train_groups, val_groups, pad, cfg)
    stage.log(f"{len(train)} prompts, reference log-probs of every response computed")
    last_batch: dict[str, float] = {}

    def batch_loss(rows: list[int]) -> tuple[Tensor, int]:
        groups, reference = [train_groups[i] for i in rows], [train_reference[i] for i in rows]
        loss, stats, tokens = pair_loss(policy, groups, reference, pad, cfg)
        last_batch.update(stats)
        return loss, tokens

    def validation() -> dict[str, float]:
        return mean_pair_loss(policy, val_groups, val_reference, pad, cfg, chunk)

    objective = Objective(
        batch_loss=batch_loss,
        units=lambda rows: paired([train_groups[i] for i in rows]),  # prompts with a pair
        step_stats=lambda: dict(last_batch),
        evaluate=validation,
        fresh_extra=validation,  # the same measures for the SFT policy, before training
    )
    history, policy = fitting.fit(
        stage,
        policy,
        cfg,
        objective,
        n_examples=len(train),
        lengths=[g.tokens for g in train_groups],
        dropout=False,
        status=lambda loss: f"loss {loss:.3f} acc {last_batch['reward_accuracy']:.2f}",
    )
    logprobs = all_logprobs(policy, val_groups, pad, chunk)
    implicit = implicit_rewards(val_groups, logprobs, val_reference, cfg.beta)
    metrics = comparison_metrics(val, implicit, response_lengths(tokenizer, val)) | summary(history)
    fitting.publish(stage, stage.payload(policy, kind="policy"), history, metrics)
    stage.log(
        f"implicit reward accuracy {metrics['reward_accuracy']} (gold {metrics['acc_gold']}), "
        f"margin {metrics['reward_margin']}, chosen log-prob {metrics['chosen_logp']}, "
        f"rejected {metrics['rejected_logp']}"
    )
    return metrics


if __name__ == "__main__":
    main(run, data_parallel=True)
