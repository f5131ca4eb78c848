"""Simulated labelers: rank responses by the gold judge, with human-like disagreement.

Each response's gold score gets Gaussian noise whose scale is calibrated so that the share of
comparisons ranked against the gold order matches `target_flip` (InstructGPT's labelers agreed
with each other about 73% of the time). Noise on scores, rather than flipping pairs at random,
keeps every ranking consistent and makes close calls flip more often than clear ones, as they
do for people. Gold ties are broken at random and recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def _pairs(sizes: Sequence[int]) -> torch.Tensor:
    """[P, 2] flat indices of every within-row pair."""
    pair_index, offset = [], 0
    for size in sizes:
        pair_index += [(offset + i, offset + j) for i, j in combinations(range(size), 2)]
        offset += size
    return torch.tensor(pair_index, dtype=torch.long).reshape(-1, 2)


def _draws(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard normal noise and a tiny random tie-break for n scores."""
    generator = torch.Generator().manual_seed(seed)
    normal = torch.randn(n, generator=generator, dtype=torch.float64)
    return normal, torch.rand(n, generator=generator, dtype=torch.float64) * 1e-9


def noise_scale(gold_scores: Sequence[Sequence[float]], target_flip: float, seed: int) -> float:
    """The noise std at which labelers rank `target_flip` of these rows' pairs against gold."""
    if target_flip <= 0:
        return 0.0
    gold = torch.tensor([s for row in gold_scores for s in row], dtype=torch.float64)
    normal, _ = _draws(len(gold), seed)
    index = _pairs([len(row) for row in gold_scores])

    def share(scale: float) -> float:
        return _flip_share(gold[index], (gold + scale * normal)[index])

    low, high = 0.0, 1.0
    while share(high) < target_flip and high < 1e6:
        high *= 2
    scale = 0.0
    for _ in range(50):  # bisection: the flip share grows with the noise scale
        scale = (low + high) / 2
        low, high = (scale, high) if share(scale) < target_flip else (low, scale)
    return scale


def rank_with_noise(gold_scores: Sequence[Sequence[float]], scale: float, seed: int) -> Labels:
    """Rank each row by gold score plus Gaussian noise of std `scale`."""
    sizes = [len(row) for row in gold_scores]
    gold = torch.tensor([s for row in gold_scores for s in row], dtype=torch.float64)
    normal, tie_break = _draws(len(gold), seed)
    noisy = gold + scale * normal + tie_break
    index = _pairs(sizes)

    ranks, offset = [], 0
    for size in sizes:
        order = torch.argsort(noisy[offset : offset + size], descending=True).tolist()
        row = [0] * size
        for rank, position in enumerate(order):
            row[position] = rank
        ranks.append(row)
        offset += size
    return Labels(
        ranks=ranks,
        flip_share=round(_flip_share(gold[index], noisy[index]), 4),
        noise_scale=round(scale, 6),
    )


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
