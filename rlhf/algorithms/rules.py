"""Rule-based rewards, registered by name for `rl.reward: rule:NAME` (and judges of the same
name), and pairwise rules for `evaluate.judges: pairwise:rule:NAME`.

A rule scores (prompt, response) text directly: no reward model to hack, which makes rules the
quickest check that the RL loop itself learns, and the right tool when the goal is checkable.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from rlhf.synthetic.tasks import gold_score


def contains_number(prompt: str, response: str) -> float:
    """1 when the response has a digit: the seed notebook's toy reward."""
    return 1.0 if re.search(r"\d", response) else 0.0


RULES: dict[str, Callable[[str, str], float]] = {
    "contains_number": contains_number,
    "gold": gold_score,  # the task suite's judge: an oracle reward, for comparison runs
}


def shorter(prompt: str, first: str, second: str) -> float:
    """The shorter answer wins (1: the first, 0: the second, 0.5: as long): a probe of length
    bias, since a policy can buy a reward model's favour with longer answers. Length is
    counted in characters with surrounding space stripped."""
    a, b = len(first.strip()), len(second.strip())
    return 1.0 if a < b else 0.0 if a > b else 0.5


PAIR_RULES: dict[str, Callable[[str, str, str], float]] = {"shorter": shorter}
