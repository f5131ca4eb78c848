"""Simulated labelers: rank responses by the gold judge, with human-like disagreement.

Each response's gold score gets Gaussian noise whose scale is calibrated so that the share of
comparisons ranked against the gold order matches `target_flip` (InstructGPT's labelers agreed
with each other about 73% of the time). Noise on scores, rather than flipping pairs at random,
keeps every ranking consistent and makes close calls flip more often than clear ones, as they
do for people. Gold ties are broken at random and recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

import torch


@dataclass(frozen=True)
class Labels:
    ranks: list[list[int]]  # per row, rank of each response, 0 = best
    flip_share: float  # achieved share of gold-ordered pairs ranked the other way
    noise_scale: float


def _flip_share(gold: torch.Tensor, noisy: torch.Tensor) -> float:
    """Share of pairs with distinct gold scores that the noisy scores order the other way.
    gold, noisy: [P, 2] scores of each pair's two responses."""
    gold_diff = gold[:, 0] - gold[:, 1]
    distinct = gold_diff != 0
    if not bool(distinct.any()):
        return 0.0
    disagree = (gold_diff * (noisy[:, 0] - noisy[:, 1])) < 0
    return float(disagree[distinct].float().mean())


def _pairs(sizes: Sequence[int], counted: Sequence[int]) -> torch.Tensor:
    """[P, 2] flat indices of every within-row pair among each row's first `counted` responses
    (rows hold `sizes` responses)."""
    pair_index, offset = [], 0
    for size, count in zip(sizes, counted, strict=True):
        pair_index += [(offset + i, offset + j) for i, j in combinations(range(count), 2)]
        offset += size
    return torch.tensor(pair_index, dtype=torch.long).reshape(-1, 2)


def _draws(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard normal noise and a tiny random tie-break for n scores."""
    generator = torch.Generator().manual_seed(seed)
    normal = torch.randn(n, generator=generator, dtype=torch.float64)
    return normal, torch.rand(n, generator=generator, dtype=torch.float64) * 1e-9


def rank_with_noise(
    gold_scores: Sequence[Sequence[float]],
    target_flip: float,
    seed: int,
    calibrated_on: Sequence[int] | None = None,
) -> Labels:
    """Rank each row by gold score plus Gaussian noise, its std set so that these very draws
    rank `target_flip` of the calibration pairs against gold: the pairs among each row's first
    `calibrated_on[i]` responses (every pair when None).

    Calibrating on the draws the ranking uses makes the realised flip share the target up to
    one pair in P, whatever the data or the device; calibrating on other draws (the calibration
    set's own) only matched it on average, and drifted with the data.
    """
    sizes = [len(row) for row in gold_scores]
    gold = torch.tensor([s for row in gold_scores for s in row], dtype=torch.float64)
    normal, tie_break = _draws(len(gold), seed)

    def noisy(scale: float) -> torch.Tensor:
        return gold + scale * normal + tie_break

    calibration = _pairs(sizes, sizes if calibrated_on is None else calibrated_on)
    scale = _noise_scale(gold[calibration], lambda scale: noisy(scale)[calibration], target_flip)
    scores = noisy(scale)
    ranks, offset = [], 0
    for size in sizes:
        order = torch.argsort(scores[offset : offset + size], descending=True).tolist()
        row = [0] * size
        for rank, position in enumerate(order):
            row[position] = rank
        ranks.append(row)
        offset += size
    every_pair = _pairs(sizes, sizes)
    return Labels(
        ranks=ranks,
        flip_share=round(_flip_share(gold[every_pair], scores[every_pair]), 4),
        noise_scale=round(scale, 6),
    )


def _noise_scale(
    gold: torch.Tensor, noisy: Callable[[float], torch.Tensor], target_flip: float
) -> float:
    """The noise std at which `noisy(std)` orders `target_flip` of the pairs against `gold`
    (both [P, 2]), by bisection: the flip share grows with the std."""
    if target_flip <= 0:
        return 0.0

    def share(scale: float) -> float:
        return _flip_share(gold, noisy(scale))

    low, high = 0.0, 1.0
    while share(high) < target_flip and high < 1e6:
        high *= 2
    scale = 0.0
    for _ in range(50):
        scale = (low + high) / 2
        low, high = (scale, high) if share(scale) < target_flip else (low, scale)
    return scale


def disagreement(
    gold_scores: Sequence[Sequence[float]], ranks: Sequence[Sequence[int]]
) -> tuple[float, float]:
    """(share of gold-distinct pairs ranked against gold, share of pairs tied in gold)."""
    flipped = distinct = total = 0
    for gold, rank in zip(gold_scores, ranks, strict=True):
        for i, j in combinations(range(len(gold)), 2):
            total += 1
            if gold[i] != gold[j]:
                distinct += 1
                flipped += (gold[i] > gold[j]) != (rank[i] < rank[j])
    return round(flipped / max(distinct, 1), 4), round((total - distinct) / max(total, 1), 4)
