"""The labeling queue and the labels people give its items.

`collect.labeler: human` turns each prompt's candidate answers (the K samples, plus the
training side's explored and mismatched answers) into one queue item: its answers
deduplicated and shuffled, so a position says nothing about where an answer came from, and
its id a digest of the prompt and answers, so a label stays attached to exactly what its
labeler saw. Each labeler's labels are one Parquet file, one row per item ranked or skipped;
the collect stage turns the finished rankings into comparisons, a row per label. One labeling
session at a time holds a labeler's file (`hold_labels`).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from rlhf.data.schemas import DataError, read_rows, write_rows
from rlhf.errors import PipelineError
from rlhf.labeling.ranking import Agreement, agreement, letters
from rlhf.locks import try_lock

Rows = list[dict[str, Any]]

TRAIN, HELDOUT = "train", "val"
QUEUE_SCHEMA = pa.schema(
    [
        pa.field("item", pa.string()),
        pa.field("prompt", pa.string()),
        pa.field("responses", pa.list_(pa.string())),
        pa.field("split", pa.string()),  # train | val: which comparisons its labels become
        pa.field("round", pa.string()),  # the sampling run it came from (collect's fingerprint)
        pa.field("task", pa.string()),
        pa.field("source", pa.string()),
    ]
)
LABEL_SCHEMA = pa.schema(
    [
        pa.field("item", pa.string()),
        pa.field("labeler", pa.string()),
        pa.field("ranking", pa.list_(pa.int32())),  # rank per response, 0 best; empty: skipped
        pa.field("labeled_at", pa.string()),
    ]
)
LABEL_SUFFIX = ".parquet"
LABELER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # also a file name
LOCKS = ".rlhf"  # the folder of lock files beside the labels, which git and DVC ignore


def item_id(prompt: str, responses: Sequence[str]) -> str:
    digest = hashlib.sha256("\0".join([prompt, *responses]).encode())
    return digest.hexdigest()[:16]


def queue_items(train: Rows, heldout: Rows, round_id: str, seed: int) -> Rows:
    """One item per prompt with at least two distinct answers, answers shuffled."""
    rng = random.Random(seed)
    items = []
    for split, rows in ((TRAIN, train), (HELDOUT, heldout)):
        for row in rows:
            answers = list(dict.fromkeys(row["responses"]))
            if len(answers) < 2:
                continue
            rng.shuffle(answers)
            letters(len(answers))  # more answers than letters is refused before anyone labels
            items.append(
                {
                    "item": item_id(row["prompt"], answers),
                    "prompt": row["prompt"],
                    "responses": answers,
                    "split": split,
                    "round": round_id,
                    "task": row["task"],
                    "source": row["source"],
                }
            )
    return items


def read_queue(path: Path) -> Rows:
    return read_rows(path, QUEUE_SCHEMA)


def write_queue(path: Path, items: Rows) -> None:
    write_rows(path, items, QUEUE_SCHEMA)


def labels_file(folder: Path, labeler: str) -> Path:
    """Where `labeler`'s labels live in the labels folder."""
    if not LABELER_NAME.fullmatch(labeler):
        raise DataError(f"labeler name {labeler!r}: use letters, digits, '.', '-' or '_'")
    return folder / f"{labeler}{LABEL_SUFFIX}"


def read_labels(path: Path) -> Rows:
    """One labeler's labels in the order given (undo takes the last); [] before the first."""
    return read_rows(path, LABEL_SCHEMA) if path.exists() else []


def write_labels(path: Path, labels: Rows) -> None:
    """Atomically: a kill leaves the previous labels whole."""
    write_rows(path, labels, LABEL_SCHEMA)


class LabelsBusy(PipelineError):
    """Another `rlhf label` session holds this labeler's labels file."""


@contextmanager
def hold_labels(path: Path) -> Iterator[None]:
    """Hold the labels file `path` for one labeling session; LabelsBusy if another holds it.

    Two sessions under one name (two terminals, one person) would show the same items and
    rank them twice. The lock (`rlhf.locks`) refuses at once rather than waiting, since the
    holder is a person who may label for hours. Its file sits in LOCKS beside the labels,
    which git and DVC ignore (.gitignore, .dvcignore), so a lock is never committed nor
    changes the collect stage's labels dep.
    """
    handle = try_lock(path.parent / LOCKS / f"{path.name}.lock")
    if handle is None:
        raise LabelsBusy(
            f"{path}: another `rlhf label` session holds it; go on in that one, or quit it first"
        )
    with handle:
        yield


def new_label(item: str, labeler: str, ranking: Sequence[int]) -> dict[str, Any]:
    return {
        "item": item,
        "labeler": labeler,
        "ranking": list(ranking),
        "labeled_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def all_labels(folder: Path, queue: Rows) -> Rows:
    """Every labeler's rankings (skips left out) of items in `queue`, checked against the
    items: a ranking of another number of answers is an error naming its file and row."""
    answers = {item["item"]: len(item["responses"]) for item in queue}
    found = []
    for path in sorted(folder.glob(f"*{LABEL_SUFFIX}")):
        for row, label in enumerate(read_labels(path), start=1):
            n = answers.get(label["item"])
            if n is None or not label["ranking"]:
                continue
            ranking = label["ranking"]
            dense = sorted(set(ranking)) == list(range(len(set(ranking))))
            if len(ranking) != n or not dense:
                raise DataError(
                    f"{path}: row {row}, field 'ranking': {ranking!r} is not a ranking of "
                    f"the item's {n} answers"
                )
            found.append(label)
    return found


def waiting_items(queue: Rows, labels: Rows, per_item: int) -> Rows:
    """Items with fewer than `per_item` labels."""
    counts = defaultdict(int)
    for label in labels:
        counts[label["item"]] += 1
    return [item for item in queue if counts[item["item"]] < per_item]


def comparisons_from_labels(queue: Rows, labels: Rows) -> tuple[Rows, Rows]:
    """(train, held-out) comparison rows, one per label that orders at least two answers:
    every labeler's view is kept, as InstructGPT kept each labeler's rankings."""
    by_id = {item["item"]: item for item in queue}
    sides: dict[str, Rows] = {TRAIN: [], HELDOUT: []}
    for label in labels:
        if len(set(label["ranking"])) < 2:
            continue  # all tied: no preference to learn
        item = by_id[label["item"]]
        sides[item["split"]].append(
            {
                "prompt": item["prompt"],
                "responses": item["responses"],
                "ranks": label["ranking"],
                "task": item["task"],
                "source": f"human:{label['labeler']}",
                "gold_scores": [],
            }
        )
    return sides[TRAIN], sides[HELDOUT]


def inter_labeler(labels: Iterable[dict[str, Any]]) -> Agreement:
    """Agreement over every pair of labelers who ranked the same item."""
    by_item: dict[str, list[Sequence[int]]] = defaultdict(list)
    for label in labels:
        by_item[label["item"]].append(label["ranking"])
    total = Agreement()
    for rankings in by_item.values():
        for i, first in enumerate(rankings):
            for second in rankings[i + 1 :]:
                total += agreement(first, second)
    return total


def labeling_stats(queue: Rows, labels: Rows) -> dict[str, Any]:
    """The collect stage's metrics of a human-labeled round."""
    overlap = inter_labeler(labels)
    per_item = defaultdict(int)
    for label in labels:
        per_item[label["item"]] += 1
    own = sum((agreement(label["ranking"], label["ranking"]) for label in labels), Agreement())
    return {
        "queue_items": len(queue),
        "labels": len(labels),
        "labelers": len({label["labeler"] for label in labels}),
        "items_labeled_twice": sum(n >= 2 for n in per_item.values()),
        "labeler_tie_share": round(1 - own.decisive / own.pairs, 4) if own.pairs else None,
        "inter_labeler_agreement": overlap.rate,
        "inter_labeler_agreement_with_ties": overlap.rate_with_ties,
        "inter_labeler_pairs": overlap.decisive,
    }
