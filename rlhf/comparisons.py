"""Ranked comparisons tokenized for training: the reward model's and DPO's shared input.

Each prompt's distinct responses are encoded once; its ranking then defines every pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlhf.data import Example, encode_example
from rlhf.tokenizer import Tokenizer


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
