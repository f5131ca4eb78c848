"""Rule-based rewards, registered by name for `rl.reward: rule:NAME`.

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
