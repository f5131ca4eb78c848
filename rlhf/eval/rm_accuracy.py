"""How well a reward model orders held-out comparisons.

Accuracy against the noisy labels is what the RM was trained to fit; accuracy against the clean
gold ordering is what matters, bucketed by the gold margin because close pairs are hard even for
the judge's noisy labelers. The correlation of reward with response length is the classic early
sign of a reward model that PPO will hack by rambling.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from itertools import combinations
from typing import Any

import torch

MARGIN_BUCKETS = ((0.0, 0.1), (0.1, 0.2), (0.2, 0.5), (0.5, 1.01))


def _bucket_name(low: float, high: float) -> str:
    return f"{low:g}-{min(high, 1.0):g}"


def _accuracy(hits: list[float]) -> float | None:
    return round(sum(hits) / len(hits), 4) if hits else None


def comparison_metrics(
    rows: Sequence[dict[str, Any]], rewards: Sequence[Sequence[float]], lengths: Sequence[int]
) -> dict[str, Any]:
    """rows: ranked rows with `ranks`, `task` and (possibly empty) `gold_scores`;
    rewards: the RM's reward of each row's responses; lengths: tokens of every response."""
    noisy: list[float] = []
    gold: list[float] = []
    by_margin: defaultdict[str, list[float]] = defaultdict(list)
    by_task: defaultdict[str, list[float]] = defaultdict(list)
    wide: list[float] = []

    def hit(diff_reward: float, diff_label: float) -> float:
        return 0.5 if diff_reward == 0 else float((diff_reward > 0) == (diff_label > 0))

    for row, row_rewards in zip(rows, rewards, strict=True):
        for i, j in combinations(range(len(row["ranks"])), 2):
            diff = row_rewards[i] - row_rewards[j]
            if row["ranks"][i] != row["ranks"][j]:
                noisy.append(hit(diff, row["ranks"][j] - row["ranks"][i]))
            if not row["gold_scores"]:
                continue
            margin = round(row["gold_scores"][i] - row["gold_scores"][j], 6)  # 1.0 - 0.9 -> 0.1
            if margin == 0:
                continue
            correct = hit(diff, margin)
            gold.append(correct)
            by_task[row["task"]].append(correct)
            for low, high in MARGIN_BUCKETS:
                if low <= abs(margin) < high:
                    by_margin[_bucket_name(low, high)].append(correct)
            if abs(margin) >= 0.2:
                wide.append(correct)

    flat_rewards = torch.tensor([r for row in rewards for r in row], dtype=torch.float64)
    flat_lengths = torch.tensor(lengths, dtype=torch.float64)
    length_corr = torch.corrcoef(torch.stack([flat_rewards, flat_lengths]))[0, 1]
    return {
        "acc_noisy": _accuracy(noisy),
        "acc_gold": _accuracy(gold),
        "acc_gold_margin_ge_0_2": _accuracy(wide),
        "acc_gold_by_margin": {
            _bucket_name(low, high): _accuracy(by_margin[_bucket_name(low, high)])
            for low, high in MARGIN_BUCKETS
        },
        "pairs_by_margin": {
            _bucket_name(low, high): len(by_margin[_bucket_name(low, high)])
            for low, high in MARGIN_BUCKETS
        },
        "acc_gold_by_task": {t: _accuracy(v) for t, v in sorted(by_task.items())},
        "reward_length_corr": round(float(length_corr), 4),
        "pairs_val": len(noisy),
    }
