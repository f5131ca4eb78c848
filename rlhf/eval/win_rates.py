"""Win rates of paired answers and their bootstrap intervals.

Answers are paired by prompt and sample index. The headline rate counts a tie as half a win, as
InstructGPT's preference rates do; with a judge that often scores two answers the same, that
pulls every rate toward 0.5, so the tie rate and the decisive win rate (wins over wins plus
losses, ties left out) are reported beside it.
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
    weights: Sequence[float] | None = None,
    level: float = 0.95,
) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of sum(values) / sum(weights) (the mean when weights are
    all 1), resampling whole groups.

    Values that share a group (the answers to one prompt) are correlated; resampling them one
    by one would pretend there is more independent evidence than there is. Resamples whose
    weights sum to 0 have no statistic and are left out; None when none has one.
    """
    if len(values) != len(groups):
        raise ValueError(f"{len(values)} values but {len(groups)} group labels")
    if not values:
        raise ValueError("bootstrap interval of an empty set is undefined")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    _, group_of = np.unique(np.asarray(groups), return_inverse=True)
    sums = np.bincount(group_of, weights=np.asarray(values, dtype=np.float64))  # [G]
    counts = np.bincount(group_of, weights=None if weights is None else np.asarray(weights))
    draws = np.random.default_rng(seed).integers(0, len(sums), size=(resamples, len(sums)))
    totals = counts.astype(np.float64)[draws].sum(1)  # [resamples]
    stats = sums[draws].sum(1)[totals > 0] / totals[totals > 0]
    if not len(stats):
        return None, None
    low, high = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


@dataclass(frozen=True)
class WinRate:
    rate: float  # ties half
    low: float  # 95% bootstrap interval of `rate`
    high: float
    tie_rate: float
    decisive: float | None  # wins / (wins + losses); None when every pair ties
    decisive_low: float | None  # its 95% bootstrap interval
    decisive_high: float | None


def compare(
    scores: Sequence[float],
    baseline: Sequence[float],
    groups: Sequence[int],
    *,
    resamples: int,
    seed: int,
) -> WinRate:
    """Win rate of `scores` over `baseline` (ties half, and decisive), with 95% intervals over
    the prompts in `groups`; both intervals use the same resampled prompts."""
    return compare_outcomes(outcomes(scores, baseline), groups, resamples=resamples, seed=seed)


def compare_outcomes(
    wins: Sequence[float], groups: Sequence[int], *, resamples: int, seed: int
) -> WinRate:
    """The win rate of pairs whose outcomes are given (1 a win, 0.5 a tie, 0 a loss: a
    pairwise judge's verdicts), as `compare` reports it."""
    if not wins:
        raise ValueError("win rate of an empty set is undefined")
    if not set(wins) <= {0.0, 0.5, 1.0}:
        raise ValueError(f"outcomes must be 0, 0.5 or 1, got {sorted(set(wins) - {0, 0.5, 1})}")
    low, high = bootstrap_interval(wins, groups, resamples=resamples, seed=seed)
    assert low is not None and high is not None
    decided = [float(w != 0.5) for w in wins]
    won = [float(w == 1.0) for w in wins]
    n_decided = sum(decided)
    decisive_low, decisive_high = bootstrap_interval(
        won, groups, resamples=resamples, seed=seed, weights=decided
    )
    return WinRate(
        rate=sum(wins) / len(wins),
        low=low,
        high=high,
        tie_rate=1 - n_decided / len(wins),
        decisive=sum(won) / n_decided if n_decided else None,
        decisive_low=decisive_low,
        decisive_high=decisive_high,
    )
