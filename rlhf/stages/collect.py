"""collect: comparison data for the reward model, as InstructGPT gathered it.

With `collect.source: policy`, K answers per training prompt are sampled from the SFT policy
and ranked by `collect.labeler` (`rlhf.synthetic.collection`): simulated labelers on the task
suite, a reward model (AI feedback) on any prompts, or people: `human` writes the answers as
a labeling queue and stops until `rlhf label` has ranked them. With `files`, comparisons
imported by `rlhf import` take their place. Either way the comparisons are split by prompt
into train and held-out sets, so the reward model is scored on prompts it never saw.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from typing import Any

from rlhf.algorithms.scorers import build
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
from rlhf.errors import PipelineError
from rlhf.labeling.queue import (
    all_labels,
    comparisons_from_labels,
    labeling_stats,
    queue_items,
    read_queue,
    waiting_items,
    write_queue,
)
from rlhf.project import paths
from rlhf.project.folders import require_tracked
from rlhf.project.specs import StageSpec
from rlhf.reward_sources import LABELER
from rlhf.stages.support.common import file_digest, progress
from rlhf.stages.support.context import StageRun
from rlhf.stages.support.entry import main
from rlhf.stages.support.outputs import published, write_metrics, write_timings
from rlhf.stages.support.scoring import (
    prompt_references,
    require_sources_tracked,
    scoring_context,
)
from rlhf.synthetic.collection import (
    BatchScore,
    candidates,
    comparisons_from_samples,
    gold_scores,
    sample_rows,
    scored,
)

SPEC = StageSpec(
    "collect",
    "rlhf.stages.collect",
    params=("seed", "device", "threads", "cpu_kernels", "memory", "collect"),
    inputs=(paths.RAW, paths.PROMPTS_TRAIN, paths.SFT_TRAIN, paths.TOKENIZER, paths.SFT_MODEL),
    outs=(paths.COMPARISONS_TRAIN, paths.COMPARISONS_VAL),
    # what it measured (pairs, label flips, ...) describes its data, not a result to compare:
    # all details, out of DVC's metrics views
    details=paths.details_file("collect"),
)


# collect params that change who labels, not what is sampled: a queue stays valid across them
NOT_SAMPLING = ("labeler", "labels_per_item", "label_noise")


class LabelsWaiting(PipelineError):
    """collect.labeler is human and the queue is not labeled yet: the pipeline stops here."""


def labeler_score(stage: StageRun) -> BatchScore:
    """`collect.labeler` as a batched score: the gold judge, a reward model's score, or the
    answer checker's (1 for a right final answer, so right answers rank above wrong ones)."""
    labeler = stage.params.labeler()
    if labeler.needs_suite:
        return gold_scores
    require_sources_tracked(stage, [labeler], LABELER)
    checks = [(key, value) for key, value in stage.params.checked() if key == LABELER]
    prompts = read_rows(paths.PROMPTS_TRAIN, PROMPT_SCHEMA)
    references = prompt_references({paths.PROMPTS_TRAIN: prompts}, checks)
    scorer = build(labeler, scoring_context(stage, references=references))
    return lambda prompts, answers: scorer(prompts, answers).tolist()


def sampled_rows(stage: StageRun) -> tuple[list, dict[str, Any]]:
    """K answers per training prompt from the SFT policy, and the sampling speed."""
    c = stage.params.collect
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
            policy, stage.tokenizer, prompts, demos, c, stage.params.seed,
            on_batch=lambda done: bar.update(task, advance=done),
        )  # fmt: skip
    seconds = time.perf_counter() - started
    return rows, {
        "sampling_seconds": round(seconds, 2),
        "sampling_tokens_per_s": round(generated / seconds),
    }


def sampled_comparisons(stage: StageRun) -> tuple[list, list, dict[str, Any]]:
    score = labeler_score(stage)
    rows, speed = sampled_rows(stage)
    scored(rows, score)
    all_scores = [s for r in rows for s in r["scores"]]
    mean_key = "gold_mean_of_samples" if score is gold_scores else "labeler_mean_of_samples"
    train, val, labeling = comparisons_from_samples(
        rows, stage.params.collect, stage.params.seed, score
    )
    if not train or not val:
        raise DataError(
            f"collect.labeler {stage.params.collect.labeler!r} told no "
            f"{'held-out' if train else 'training'} prompt's answers apart: it scored each "
            "prompt's answers alike; sample more varied answers (collect.k, "
            "collect.temperature) or import prompts the policy answers right only sometimes"
        )
    write_timings("collect", speed)
    return train, val, {mean_key: round(sum(all_scores) / len(all_scores), 4), **labeling}


def labeling_round(stage: StageRun) -> str:
    """What the queue's answers were sampled from: a new SFT model, new prompts or new collect
    params make a new round, whose queue replaces the last one."""
    sampling = {
        key: value for key, value in asdict(stage.params.collect).items() if key not in NOT_SAMPLING
    }
    settings = json.dumps([stage.params.seed, sampling], sort_keys=True)
    inputs = file_digest(paths.PROMPTS_TRAIN, paths.SFT_TRAIN, paths.TOKENIZER, paths.SFT_MODEL)
    return hashlib.sha256(f"{settings}{inputs}".encode()).hexdigest()[:16]


def labeling_queue(stage: StageRun) -> list:
    """This round's queue: the one on disk if it is this round's, else freshly sampled
    `candidates` written to paths.LABEL_QUEUE for `rlhf label`."""
    c = stage.params.collect
    round_id = labeling_round(stage)
    if paths.LABEL_QUEUE.exists():
        queue = read_queue(paths.LABEL_QUEUE)
        if queue and queue[0]["round"] == round_id:
            return queue
    rows, _ = sampled_rows(stage)
    train, val, _ = candidates(rows, c, stage.params.seed)
    queue = queue_items(train, val, round_id, stage.params.seed)
    if not queue:
        raise DataError(
            "collect.labeler is human, but no training prompt got two different answers to "
            "rank: sample more varied answers (collect.temperature, collect.k)"
        )
    write_queue(paths.LABEL_QUEUE, queue)
    return queue


def human_comparisons(stage: StageRun) -> tuple[list, list, dict[str, Any]]:
    """People's rankings of the queue; stops, saying how many items wait, until every item
    has `collect.labels_per_item` of them."""
    require_tracked(SPEC.name, paths.LABELS, "collect.labeler")
    queue = labeling_queue(stage)
    labels = all_labels(paths.LABELS, queue)
    per_item = stage.params.collect.labels_per_item
    waiting = waiting_items(queue, labels, per_item)
    if waiting:
        raise LabelsWaiting(
            f"{len(waiting)} of {len(queue)} items in {paths.LABEL_QUEUE} wait for labels "
            f"({per_item} per item): rank them with `rlhf label --labeler NAME`, then run "
            "`dvc repro` again"
        )
    train, val = comparisons_from_labels(queue, labels)
    if not train or not val:
        raise DataError(
            f"{paths.LABELS}: the labels hold no {'held-out' if train else 'training'} "
            "comparisons: every ranking of those items ties all their answers"
        )
    return train, val, labeling_stats(queue, labels)


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
    if c.source == "files":
        collected = imported_comparisons
    else:
        people = stage.params.labeler().by_people
        collected = human_comparisons if people else sampled_comparisons
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
        write_metrics(out, SPEC, metrics)
    stage.log(f"({c.source}) {metrics}")
    return metrics


if __name__ == "__main__":
    main(run)
