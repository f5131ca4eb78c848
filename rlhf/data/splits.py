"""Splits by prompt, so that no prompt is on both sides of a train/held-out boundary."""

from __future__ import annotations

import random
from typing import Any

from rlhf.data.schemas import DataError

Rows = list[dict[str, Any]]
MIN_HELDOUT = 32  # held-out prompts below which a win rate's 95% interval is wider than about ±0.17


def split_sizes(prompts: int, val_fraction: float, heldout_fraction: float) -> tuple[int, int]:
    """(held-out, validation) prompt counts out of `prompts` distinct prompts.

    The held-out share is `heldout_fraction`, raised to MIN_HELDOUT prompts where that gives
    fewer, but never above half of what validation leaves: a handful of held-out prompts makes
    every win rate's interval span most of [0, 1], while training needs the rest.
    """
    n_val = max(1, int(val_fraction * prompts))
    floor = min(MIN_HELDOUT, (prompts - n_val) // 2)
    return max(1, int(heldout_fraction * prompts), floor), n_val


def split_demonstrations(
    rows: Rows, val_fraction: float, heldout_fraction: float, seed: int, source: str
) -> dict[str, Rows]:
    """Imported demonstrations as the `prepare` sets: train and validation demonstrations,
    training and held-out prompts. One prompt's demonstrations stay on one side."""
    prompts = sorted({r["prompt"] for r in rows})
    random.Random(seed).shuffle(prompts)
    n_held, n_val = split_sizes(len(prompts), val_fraction, heldout_fraction)
    if n_held + n_val >= len(prompts):
        raise DataError(f"{source}: {len(prompts)} distinct prompts are too few to split")
    heldout, val = set(prompts[:n_held]), set(prompts[n_held : n_held + n_val])
    task_of = {r["prompt"]: r["task"] for r in rows}
    reference_of = references(rows, source)

    def prompt_rows(selected: set[str]) -> Rows:
        return [
            {"prompt": p, "reference": reference_of[p], "task": task_of[p], "source": "files"}
            for p in sorted(selected)
        ]

    train = [r for r in rows if r["prompt"] not in heldout and r["prompt"] not in val]
    return {
        "train": train,
        "val": [r for r in rows if r["prompt"] in val],
        "prompts_train": prompt_rows({r["prompt"] for r in train}),
        "prompts_heldout": prompt_rows(heldout),
    }


def references(rows: Rows, source: str) -> dict[str, str | None]:
    """Each prompt's reference answer (None where it has none). A prompt given two different
    references is refused, naming its rows: one of them is wrong, and a checker rewarding
    either would teach both."""
    found: dict[str, tuple[int, str | None]] = {}
    for number, row in enumerate(rows, start=1):
        reference = row.get("reference")
        first = found.setdefault(row["prompt"], (number, reference))
        if first[1] != reference:
            raise DataError(
                f"{source}: rows {first[0]} and {number} give the prompt {row['prompt'][:60]!r} "
                f"different references ({first[1]!r} and {reference!r}); keep one"
            )
    return {prompt: reference for prompt, (_, reference) in found.items()}


def split_comparisons(rows: Rows, val_fraction: float, seed: int) -> tuple[Rows, Rows]:
    """Hold out `val_fraction` of each task's distinct prompts with all their rows.

    Per task, because tasks differ in how many distinct prompts they have (addition has dozens
    of times more than capitals): a split over all prompts would fill the held-out set with
    the largest task and let it decide the reward model's accuracy.
    """
    rng = random.Random(seed)
    held: set[str] = set()
    for task in sorted({r["task"] for r in rows}):
        prompts = sorted({r["prompt"] for r in rows if r["task"] == task})
        rng.shuffle(prompts)
        held.update(prompts[: max(1, round(val_fraction * len(prompts)))])
    return [r for r in rows if r["prompt"] not in held], [r for r in rows if r["prompt"] in held]
