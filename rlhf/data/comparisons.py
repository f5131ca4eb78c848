"""Ranked comparisons prepared for training: the reward model's and DPO's shared input.

Each prompt's distinct responses are tokenized once; its ranking then defines every pair, and
each pair points at the rows that hold its two responses in one flattened batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import torch
from torch import Tensor

from rlhf.tokenizer.chat import Example, encode_example
from rlhf.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True)
class EncodedGroup:
    """One prompt's distinct responses, tokenized once before training, and its ranking.

    Sampling repeats answers (a greeting has few ways to be right); each distinct response is
    forwarded once, and `rows` maps every ranked response to the example that holds it.
    """

    examples: list[Example]
    rows: list[int]
    ranks: list[int]

    @property
    def tokens(self) -> int:
        return sum(len(e.ids) for e in self.examples)


def encode_groups(
    tokenizer: Tokenizer, rows: list[dict[str, Any]], block_size: int
) -> list[EncodedGroup]:
    groups = []
    for r in rows:
        distinct = list(dict.fromkeys(r["responses"]))
        groups.append(
            EncodedGroup(
                [encode_example(tokenizer, r["prompt"], x, block_size) for x in distinct],
                [distinct.index(x) for x in r["responses"]],
                r["ranks"],
            )
        )
    return groups


def response_lengths(tokenizer: Tokenizer, rows: list[dict[str, Any]]) -> list[int]:
    """Tokens of every ranked response, row by row: what the length-bias metric correlates
    the rewards with."""
    return [len(tokenizer.encode(x)) for r in rows for x in r["responses"]]


@dataclass(frozen=True)
class Pairs:
    """Comparisons among the rows of one flattened batch of responses."""

    better: Tensor  # [P] row index of the preferred response
    worse: Tensor  # [P] row index of the other one
    weight: (
        Tensor  # [P] 1 / (pairs of its prompt * prompts with a pair): each prompt weighs the same
    )


def group_pairs(group: EncodedGroup, offset: int = 0) -> list[tuple[int, int]]:
    """The (better, worse) rows of one group's ranked pairs, numbered from `offset`: equal
    ranks and two copies of one answer (the same row) give none."""
    ranks, row_of = group.ranks, group.rows
    return [
        (offset + row_of[i], offset + row_of[j])
        if ranks[i] < ranks[j]
        else (offset + row_of[j], offset + row_of[i])
        for i, j in combinations(range(len(ranks)), 2)
        if ranks[i] != ranks[j] and row_of[i] != row_of[j]
    ]


def paired(groups: Sequence[EncodedGroup]) -> int:
    """How many of `groups` have a pair: the prompts a ranking loss averages over."""
    return sum(1 for group in groups if group_pairs(group))


def ranking_pairs(groups: Sequence[EncodedGroup]) -> Pairs:
    """Every ranked pair of each group's responses, rows numbered across the flattened batch
    of all groups' distinct examples.

    Equal ranks give no pair, and neither do two copies of one answer (the same row): no
    preference can hold between identical texts, and counting them would only shrink their
    prompt's weight. A prompt left with no pair drops out of the average.
    """
    per_group: list[list[tuple[int, int]]] = []
    offset = 0
    for group in groups:
        per_group.append(group_pairs(group, offset))
        offset += len(group.examples)
    counted = sum(1 for pairs in per_group if pairs)
    flat = [pair for pairs in per_group for pair in pairs]
    weights = [1.0 / (len(pairs) * counted) for pairs in per_group for _ in pairs]
    return Pairs(
        better=torch.tensor([b for b, _ in flat], dtype=torch.long),
        worse=torch.tensor([w for _, w in flat], dtype=torch.long),
        weight=torch.tensor(weights),
    )
