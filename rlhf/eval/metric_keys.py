"""How the evaluation names its numbers, apart from computing them (no torch): which policies
it measures, and nested metrics as the dotted keys `dvc metrics show` prints. What reads
recorded runs (`rlhf compare`, CI's check) needs the names alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def evaluated_policies(rl_algorithms: Sequence[str]) -> list[str]:
    """The policies evaluate measures, in the report's order: SFT, each RL algorithm's, DPO."""
    return ["sft", *rl_algorithms, "dpo"]


def flattened(prefix: str, value: Any) -> dict[str, Any]:
    """Nested dicts as one flat dict with dotted keys, as `dvc metrics show` names them, each
    under `prefix` (none when it is empty)."""
    if not isinstance(value, Mapping):
        return {prefix: value}
    return {
        k: v
        for name, inner in value.items()
        for k, v in flattened(f"{prefix}.{name}" if prefix else str(name), inner).items()
    }
