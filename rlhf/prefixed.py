"""Params values that name a thing by a prefix and an argument: `hf:DIR`, `rm:PATH`,
`rule:NAME`. One reading of them, so `rl.reward`, `collect.labeler` and `evaluate.judges`
accept and refuse the same spellings."""

from __future__ import annotations

from collections.abc import Sequence

HF = "hf:"  # a reward model folder in Hugging Face layout
RULE = "rule:"  # a registered reward function
CHECKPOINT = "rm:"  # a reward-model checkpoint of an earlier run


def argument(value: str, prefixes: Sequence[str]) -> str | None:
    """What follows the first of `prefixes` that `value` starts with; None when `value` has
    none of them or nothing after it."""
    for prefix in prefixes:
        if value.startswith(prefix):
            return value.removeprefix(prefix).strip() or None
    return None
