"""rm: the reward model, trained on ranked comparisons with InstructGPT's K-way loss.

It starts from the SFT checkpoint (the LM head goes unused; the scalar reward head reads the
trunk) and trains on every ranked pair of each prompt with each response forwarded once.
After training the rewards are shifted so SFT demonstrations score 0 on average, and the
reward's std is recorded: RL uses both to normalize rewards.
"""

from __future__ import annotations

from typing import Any

from rlhf.algorithms.reward_model import (
    group_loss,
    mean_group_loss,
    normalize,
    score,
    score_rows,
)
from rlhf.data.comparisons import encode_groups, paired, response_lengths
from rlhf.data.schemas import COMPARISON_SCHEMA, SFT_SCHEMA, read_rows
from rlhf.eval.rm_accuracy import comparison_metrics
from rlhf.project import paths
from rlhf.project.specs import MODEL_HEADLINE, StageSpec, trained_outputs
from rlhf.stages.support import fitting
from rlhf.stages.support.context import StageRun
from rlhf.stages.support.entry import main
from rlhf.train.loop import Objective

SPEC = StageSpec(
    "rm",
    "rlhf.stages.rm",
    params=("seed", "device", "threads", "cpu_kernels", "memory", "train", "rm"),
    inputs=(
        paths.COMPARISONS_TRAIN,
        paths.COMPARISONS_VAL,
        paths.SFT_TRAIN,
        paths.TOKENIZER,
        paths.SFT_MODEL,
    ),
    **trained_outputs("rm", MODEL_HEADLINE),
)


def run() -> dict[str, Any]:
    stage = StageRun.start(SPEC)
    cfg, tokenizer, pad = stage.params.rm, stage.tokenizer, stage.tokenizer.pad_id
    train = read_rows(paths.COMPARISONS_TRAIN, COMPARISON_SCHEMA)
    val = read_rows(paths.COMPARISONS_VAL, COMPARISON_SCHEMA)
    widest = max(len(r["responses"]) for r in train + val)
    stage.preflight(paths.SFT_MODEL, stage.workload(sequences=cfg.batch_size * widest))
    model = stage.load_model(paths.SFT_MODEL)
    stage.log(f"{len(train)} prompts ({sum(len(r['ranks']) for r in train)} responses)")
    train_groups, val_groups = (
        encode_groups(tokenizer, rows, model.max_seq_len) for rows in (train, val)
    )
    objective = Objective(
        batch_loss=lambda rows: group_loss(
            model, [train_groups[i] for i in rows], pad, cfg.pooling
        ),
        units=lambda rows: paired([train_groups[i] for i in rows]),  # prompts with a pair
        evaluate=lambda: {
            "val_loss": mean_group_loss(model, val_groups, pad, cfg.pooling, cfg.batch_size)
        },
    )
    lengths = [g.tokens for g in train_groups]
    history, model = fitting.fit(
        stage, model, cfg, objective, n_examples=len(train), lengths=lengths
    )
    demos = read_rows(paths.SFT_TRAIN, SFT_SCHEMA)[: cfg.norm_samples]
    shift, std = normalize(
        model,
        score(
            model,
            tokenizer,
            [d["prompt"] for d in demos],
            [d["response"] for d in demos],
            pooling=cfg.pooling,
            batch_size=cfg.eval_batch_size,
        ),
    )
    rewards = score_rows(model, tokenizer, val, pooling=cfg.pooling, batch_size=cfg.eval_batch_size)
    metrics = {
        **comparison_metrics(val, rewards, response_lengths(tokenizer, val)),
        "val_loss": round(history.epochs[-1]["val_loss"], 6),
        "reward_shift": round(shift, 6),
        "reward_std": round(std, 6),
        "steps": len(history.steps),
    }
    payload = stage.payload(model, kind="reward", pooling=cfg.pooling, reward_std=std)
    fitting.publish(stage, payload, history, metrics)
    stage.log(
        f"acc noisy {metrics['acc_noisy']}, gold {metrics['acc_gold']}, gold margin>=0.2 "
        f"{metrics['acc_gold_margin_ge_0_2']}, by margin {metrics['acc_gold_by_margin']}, "
        f"length corr {metrics['reward_length_corr']}"
    )
    return metrics


if __name__ == "__main__":
    main(run, data_parallel=True)
