"""prepare: write the train/validation demonstrations and the train/held-out prompt sets.

Held-out prompts never appear in training or validation data, so the gold scores measured on
them are generalization, not recall.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from rlhf import tasks
from rlhf.data import PROMPT_SCHEMA, SFT_SCHEMA, read_rows, write_rows
from rlhf.params import DataParams
from stages import paths
from stages.common import console, params


def synthetic_sets(data: DataParams, seed: int) -> dict[str, list[dict[str, Any]]]:
    split = tasks.split_prompts(data.tasks, data.n_heldout, seed)
    rng = random.Random(seed)

    def demo_rows(pools: dict[str, list[str]], count: int) -> list[dict[str, Any]]:
        return [
            {
                "prompt": d.prompt,
                "response": d.response,
                "task": d.task,
                "source": f"synthetic/{d.flaw or 'ideal'}",
            }
            for d in tasks.sample_demonstrations(pools, count, data.demo_noise, rng)
        ]

    def prompt_rows(picks: list[tuple[str, str]]) -> list[dict[str, Any]]:
        return [{"prompt": p, "task": task, "source": "synthetic"} for task, p in picks]

    return {
        "train": demo_rows(split.train, data.n_train),
        "val": demo_rows(split.val, data.n_val),
        "prompts_train": prompt_rows(tasks.balanced_prompts(split.train, data.n_prompts, rng)),
        "prompts_heldout": prompt_rows(
            [(task, p) for task, pool in sorted(split.heldout.items()) for p in pool]
        ),
    }


def file_sets(data: DataParams, seed: int) -> dict[str, list[dict[str, Any]]]:
    """Split imported rows by prompt, so one prompt's demonstrations stay on one side."""
    if not paths.RAW_SFT.exists():
        raise FileNotFoundError(
            f"data.source is 'files' but {paths.RAW_SFT} does not exist; create it with "
            f"`rlhf import YOUR_FILE.jsonl` and track it with `dvc add {paths.RAW_SFT}`"
        )
    rows = read_rows(paths.RAW_SFT, SFT_SCHEMA)
    prompts = sorted({r["prompt"] for r in rows})
    random.Random(seed).shuffle(prompts)
    n_held = max(1, int(data.heldout_fraction * len(prompts)))
    n_val = max(1, int(data.val_fraction * len(prompts)))
    if n_held + n_val >= len(prompts):
        raise ValueError(f"{paths.RAW_SFT}: {len(prompts)} distinct prompts are too few to split")
    heldout, val = set(prompts[:n_held]), set(prompts[n_held : n_held + n_val])
    task_of = {r["prompt"]: r["task"] for r in rows}

    def prompt_rows(selected: set[str]) -> list[dict[str, Any]]:
        return [{"prompt": p, "task": task_of[p], "source": "files"} for p in sorted(selected)]

    train = [r for r in rows if r["prompt"] not in heldout and r["prompt"] not in val]
    return {
        "train": train,
        "val": [r for r in rows if r["prompt"] in val],
        "prompts_train": prompt_rows({r["prompt"] for r in train}),
        "prompts_heldout": prompt_rows(heldout),
    }


def run() -> dict[str, int]:
    p = params()
    sets = (
        synthetic_sets(p.data, p.seed)
        if p.data.source == "synthetic"
        else file_sets(p.data, p.seed)
    )
    write_rows(paths.SFT_TRAIN, sets["train"], SFT_SCHEMA)
    write_rows(paths.SFT_VAL, sets["val"], SFT_SCHEMA)
    write_rows(paths.PROMPTS_TRAIN, sets["prompts_train"], PROMPT_SCHEMA)
    write_rows(paths.PROMPTS_HELDOUT, sets["prompts_heldout"], PROMPT_SCHEMA)
    counts = {name: len(rows) for name, rows in sets.items()}
    per_task = Counter(r["task"] for r in sets["prompts_heldout"])
    console.print(f"prepare ({p.data.source}): {counts}; held-out per task: {dict(per_task)}")
    return counts


if __name__ == "__main__":
    run()
