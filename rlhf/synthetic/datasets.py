"""The `prepare` sets drawn from the task suite: demonstrations and prompt pools.

Held-out prompts never appear in training or validation data, so the gold scores measured on
them are generalization, not recall.
"""

from __future__ import annotations

import random
from typing import Any

from rlhf.params.groups import DataParams
from rlhf.synthetic import tasks

Rows = list[dict[str, Any]]


def synthetic_sets(data: DataParams, seed: int) -> dict[str, Rows]:
    """Train and validation demonstrations (a share `demo_noise` flawed), training prompts in
    equal shares per task, and every held-out prompt."""
    split = tasks.split_prompts(data.tasks, data.n_heldout, seed)
    rng = random.Random(seed)

    def demo_rows(pools: dict[str, list[str]], count: int) -> Rows:
        return [
            {
                "prompt": d.prompt,
                "response": d.response,
                "reference": tasks.reference_answer(d.prompt),
                "task": d.task,
                "source": f"synthetic/{d.flaw or 'ideal'}",
            }
            for d in tasks.sample_demonstrations(pools, count, data.demo_noise, rng)
        ]

    def prompt_rows(picks: list[tuple[str, str]]) -> Rows:
        return [
            {
                "prompt": p,
                "reference": tasks.reference_answer(p),
                "task": task,
                "source": "synthetic",
            }
            for task, p in picks
        ]

    return {
        "train": demo_rows(split.train, data.n_train),
        "val": demo_rows(split.val, data.n_val),
        "prompts_train": prompt_rows(tasks.balanced_prompts(split.train, data.n_prompts, rng)),
        "prompts_heldout": prompt_rows(
            [(task, p) for task, pool in sorted(split.heldout.items()) for p in pool]
        ),
    }
