"""A ranking as a labeler types it, and how far two rankings of the same answers agree.

Answers are shown under letters A, B, C, ...; a ranking lists them best first, `=` joining
answers the labeler calls equal (InstructGPT let labelers tie): `B A=C D` ranks B first, A and C
tied second, D last. Ranks are dense and 0 is best, as `rlhf.data.importers.ranks_of` makes
them from scores.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

LETTERS = string.ascii_uppercase
TIE = "="


class RankingError(ValueError):
    """Typed text that is not a full ranking of the shown answers; the message says why."""


def letters(n: int) -> str:
    if n > len(LETTERS):
        raise RankingError(f"{n} answers are more than the {len(LETTERS)} letters to show them")
    return LETTERS[:n]


def parse_ranking(text: str, n: int) -> list[int]:
    """The rank of each of `n` answers in `text` (best first, `=` ties; case and spaces
    ignored), e.g. `B A=C D` with n=4 gives [1, 0, 1, 2]."""
    shown = letters(n)
    typed = "".join(text.split()).upper()
    if not typed:
        raise RankingError(f"type every answer, best first: e.g. {' '.join(shown)}")
    if not typed.isprintable():  # an arrow key arrives as ESC [ A: name the key, not the byte
        raise RankingError(
            "arrow, function and Ctrl keys do nothing here: type the answers' letters, best "
            f"first, e.g. {' '.join(shown)}, then Enter"
        )
    groups = typed.split(TIE)
    ranks: dict[str, int] = {}
    level = -1
    for index, group in enumerate(groups):
        if not group:
            raise RankingError(f"'{TIE}' must join two answers, as in A{TIE}B")
        for position, letter in enumerate(group):
            if letter not in shown:
                raise RankingError(f"{letter!r} is not one of the answers {', '.join(shown)}")
            if letter in ranks:
                raise RankingError(f"{letter} is ranked twice")
            tied_to_previous = position == 0 and index > 0
            level += 0 if tied_to_previous else 1
            ranks[letter] = level
    missing = [letter for letter in shown if letter not in ranks]
    if missing:
        raise RankingError(f"rank every answer: {', '.join(missing)} missing")
    return [ranks[letter] for letter in shown]


def format_ranking(ranks: Sequence[int]) -> str:
    """The text `parse_ranking` reads back into `ranks`: `[1, 0, 1, 2]` gives `B A=C D`."""
    shown = letters(len(ranks))
    levels = sorted(set(ranks))
    return " ".join(
        TIE.join(shown[i] for i, rank in enumerate(ranks) if rank == level) for level in levels
    )


@dataclass(frozen=True)
class Agreement:
    """How two rankings of the same answers compare, pair of answers by pair.

    `decisive`: pairs both labelers ordered (neither tied them), `agreed` of which they
    ordered the same way, which is the agreement InstructGPT reports (72.6 ± 1.5% between its
    training labelers); `pairs` and `matched` count every pair, a tie matching only a tie.
    """

    decisive: int = 0
    agreed: int = 0
    pairs: int = 0
    matched: int = 0

    def __add__(self, other: Agreement) -> Agreement:
        return Agreement(
            self.decisive + other.decisive,
            self.agreed + other.agreed,
            self.pairs + other.pairs,
            self.matched + other.matched,
        )

    @property
    def rate(self) -> float | None:
        """Agreement on decisive pairs; None when there is none."""
        return round(self.agreed / self.decisive, 4) if self.decisive else None

    @property
    def rate_with_ties(self) -> float | None:
        return round(self.matched / self.pairs, 4) if self.pairs else None


def agreement(first: Sequence[int], second: Sequence[int]) -> Agreement:
    """Compare two rankings of the same answers."""
    if len(first) != len(second):
        raise ValueError(f"rankings of {len(first)} and {len(second)} answers")
    decisive = agreed = pairs = matched = 0
    for i, j in combinations(range(len(first)), 2):
        a, b = _order(first[i], first[j]), _order(second[i], second[j])
        pairs += 1
        matched += a == b
        if a and b:
            decisive += 1
            agreed += a == b
    return Agreement(decisive, agreed, pairs, matched)


def _order(rank_i: int, rank_j: int) -> int:
    """1 when answer i is preferred, -1 when j is, 0 for a tie."""
    return (rank_i < rank_j) - (rank_i > rank_j)
