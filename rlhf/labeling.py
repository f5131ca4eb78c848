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
    tie_share: float  # share of pairs whose gold scores were equal (order set at random)
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


def noisy_rankings(gold_scores: Sequence[Sequence[float]], target_flip: float, seed: int) -> Labels:
    generator = torch.Generator().manual_seed(seed)
    sizes = [len(row) for row in gold_scores]
    gold = torch.tensor([s for row in gold_scores for s in row], dtype=torch.float64)
    normal = torch.randn(len(gold), generator=generator, dtype=torch.float64)
    tie_break = torch.rand(len(gold), generator=generator, dtype=torch.float64) * 1e-9

    pair_index, offset = [], 0
    for size in sizes:
        pair_index += [(offset + i, offset + j) for i, j in combinations(range(size), 2)]
        offset += size
    index = torch.tensor(pair_index, dtype=torch.long)  # [P, 2]

    def share(scale: float) -> float:
        return _flip_share(gold[index], (gold + scale * normal)[index])

    low, high = 0.0, 1.0
    while target_flip > 0 and share(high) < target_flip and high < 1e6:
        high *= 2
    scale = 0.0
    if target_flip > 0:
        for _ in range(50):  # bisection: the flip share grows with the noise scale
            scale = (low + high) / 2
            low, high = (scale, high) if share(scale) < target_flip else (low, scale)
    noisy = gold + scale * normal + tie_break

    ranks, offset = [], 0
    for size in sizes:
        order = torch.argsort(noisy[offset : offset + size], descending=True).tolist()
        row = [0] * size
        for rank, position in enumerate(order):
            row[position] = rank
        ranks.append(row)
        offset += size
    ties = (gold[index[:, 0]] == gold[index[:, 1]]).float().mean() if len(index) else 0.0
    return Labels(
        ranks=ranks,
        flip_share=round(share(scale), 4),
        tie_share=round(float(ties), 4),
        noise_scale=round(scale, 6),
    )
