"""collect: comparison data for the reward model, as InstructGPT gathered it.

With `collect.source: policy`, K answers per training prompt are sampled from the SFT policy
and ranked by `collect.labeler` (`rlhf.synthetic.collection`): simulated labelers on the task
suite, or a reward model (AI feedback) on any prompts; with `files`, comparisons imported by
`rlhf import` take their place. Either way the comparisons are split by prompt
into train and held-out sets, so the reward model is scored on prompts it never saw.
"""

from __future__ import annotations

import time
from typing import Any

from rlhf.algorithms.scorers import RewardModelScorer, external_scorer
from rlhf.atomic import write_json
from rlhf.data.schemas import (
    COMPARISON_SCHEMA,
    PROMPT_SCHEMA,
    RANKED_SCHEMA,
    SFT_SCHEMA,
    DataError,
    read_rows,
    write_rows,
)
from rlhf.data.splits import split_comparisons
from rlhf.stages import paths
from rlhf.stages.common import progress
from rlhf.stages.context import StageRun
from rlhf.stages.entry import main
from rlhf.stages.folders import HF_REWARD, labeler_path, require_tracked
from rlhf.stages.outputs import published
from rlhf.stages.specs import StageSpec
from rlhf.synthetic.collection import (
    BatchScore,
    comparisons_from_samples,
    gold_scores,
    sample_rows,
)

SPEC = StageSpec(
    "collect",
    "rlhf.stages.collect",
    params=("seed", "device", "memory", "collect"),
    inputs=(paths.RAW, paths.PROMPTS_TRAIN, paths.SFT_TRAIN, paths.TOKENIZER, paths.SFT_MODEL),
    outs=(paths.COMPARISONS_TRAIN, paths.COMPARISONS_VAL),
    metrics=(paths.metrics_file("collect"),),
)


def labeler_score(stage: StageRun) -> BatchScore:
    """`collect.labeler` as a batched score: the gold judge, or a reward model's score."""
    path = labeler_path(stage.params)
    if path is None:
        return gold_scores
    require_tracked(SPEC.name, path, "collect.labeler")
    if stage.params.collect.labeler.startswith(HF_REWARD):
        scorer = external_scorer(path, stage.device, stage.frozen_bf16)
    else:
        scorer = RewardModelScorer.load(path, stage.tokenizer, stage.device)
    return lambda prompts, answers: scorer(prompts, answers).tolist()


def sampled_comparisons(stage: StageRun) -> tuple[list, list, dict[str, Any]]:
    c = stage.params.collect
    score = labeler_score(stage)
    prompts = read_rows(paths.PROMPTS_TRAIN, PROMPT_SCHEMA)
    demos: dict[str, str] = {}
    if c.include_demo:
        for row in read_rows(paths.SFT_TRAIN, SFT_SCHEMA):
            demos.setdefault(row["prompt"], row["response"])
    stage.preflight(paths.SFT_MODEL, stage.workload(trained=0, frozen=1, sampled=c.batch_size))
    policy = stage.load_frozen(paths.SFT_MODEL)
    started = time.perf_counter()
    with progress() as bar:
        task = bar.add_task("collect", total=len(prompts) * (c.k + c.explore), extra=f"K={c.k}")
        rows, generated = sample_rows(
            policy, stage.tokenizer, prompts, demos, c, stage.params.seed, score,
            on_batch=lambda done: bar.update(task, advance=done),
        )  # fmt: skip
    seconds = time.perf_counter() - started
    all_scores = [s for r in rows for s in r["scores"]]
    mean_key = "gold_mean_of_samples" if score is gold_scores else "labeler_mean_of_samples"
    train, val, labeling = comparisons_from_samples(rows, c, stage.params.seed, score)
    return (
        train,
        val,
        {
            mean_key: round(sum(all_scores) / len(all_scores), 4),
            "sampling_seconds": round(seconds, 2),
            "sampling_tokens_per_s": round(generated / seconds),
            **labeling,
        },
    )


def imported_comparisons(stage: StageRun) -> tuple[list, list, dict[str, Any]]:
    if not paths.RAW_COMPARISONS.exists():
        raise DataError(
            f"collect.source is 'files' but {paths.RAW_COMPARISONS} does not exist; create it "
            "with `rlhf import FILE --kind pairwise|hh|ranked` and `dvc add` it"
        )
    rows = [{**r, "gold_scores": []} for r in read_rows(paths.RAW_COMPARISONS, RANKED_SCHEMA)]
    train, val = split_comparisons(rows, stage.params.collect.val_fraction, stage.params.seed)
    return train, val, {}


def run() -> dict[str, Any]:
    stage = StageRun.start(SPEC)
    c = stage.params.collect
    collected = sampled_comparisons if c.source == "policy" else imported_comparisons
    train, val, stats = collected(stage)
    metrics = {
        "prompts": len(train) + len(val),
        "prompts_train": len(train),
        "prompts_val": len(val),
        "pairs": sum(len(r["responses"]) * (len(r["responses"]) - 1) // 2 for r in train + val),
        **stats,
    }
    with published(SPEC) as out:
        write_rows(out[paths.COMPARISONS_TRAIN], train, COMPARISON_SCHEMA)
        write_rows(out[paths.COMPARISONS_VAL], val, COMPARISON_SCHEMA)
        write_json(out[paths.metrics_file("collect")], metrics)
    stage.log(f"({c.source}) {metrics}")
    return metrics


if __name__ == "__main__":
    main(run)
