"""Win rates of paired answers and their bootstrap intervals.

Answers are paired by prompt and sample index; a tie counts as half a win, as in InstructGPT's
preference rates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def outcomes(scores: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Per pair: 1 where `scores` wins, 0.5 for a tie, 0 for a loss."""
    if len(scores) != len(baseline):
        raise ValueError(f"win rate needs paired scores, got {len(scores)} and {len(baseline)}")
    if not scores:
        raise ValueError("win rate of an empty set is undefined")
    return [1.0 if a > b else 0.5 if a == b else 0.0 for a, b in zip(scores, baseline, strict=True)]


def win_rate(scores: Sequence[float], baseline: Sequence[float]) -> float:
    """Share of paired answers where `scores` beats `baseline`, a tie counting half."""
    wins = outcomes(scores, baseline)
    return sum(wins) / len(wins)


def bootstrap_interval(
    values: Sequence[float],
    groups: Sequence[int],
    *,
    resamples: int,
    seed: int,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values`, resampling whole groups.

    Values that share a group (the answers to one prompt) are correlated; resampling them one
    by one would pretend there is more independent evidence than there is.
    """
    if len(values) != len(groups):
        raise ValueError(f"{len(values)} values but {len(groups)} group labels")
    if not values:
        raise ValueError("bootstrap interval of an empty set is undefined")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    _, group_of = np.unique(np.asarray(groups), return_inverse=True)
    sums = np.bincount(group_of, weights=np.asarray(values, dtype=np.float64))  # [G]
    counts = np.bincount(group_of).astype(np.float64)  # [G]
    draws = np.random.default_rng(seed).integers(0, len(sums), size=(resamples, len(sums)))
    means = sums[draws].sum(1) / counts[draws].sum(1)  # [resamples]
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


@dataclass(frozen=True)
class WinRate:
    rate: float
    low: float  # 95% bootstrap interval
    high: float


def compare(
    scores: Sequence[float],
    baseline: Sequence[float],
    groups: Sequence[int],
    *,
    resamples: int,
    seed: int,
) -> WinRate:
    """Win rate of `scores` over `baseline` with a 95% interval over the prompts in `groups`."""
    wins = outcomes(scores, baseline)
    low, high = bootstrap_interval(wins, groups, resamples=resamples, seed=seed)
    return WinRate(sum(wins) / len(wins), low, high)
