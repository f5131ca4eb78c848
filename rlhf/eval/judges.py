"""Judges: who decides, of two answers to one prompt, which is better.

Win rates are only as good as their judge, so every win rate is reported under its judge's
name (`win_rate.<judge>.<a>_vs_<b>`). `gold` is the task suite's programmatic judge, which
plays the human labeler and exists only for prompts from the suite. `rm` is the trained reward
model: on any prompts, but it is the proxy the RL policies optimized, so it flatters them.
`hf:DIR` (a reward model trained elsewhere) and `rule:NAME` (a registered reward function)
judge independently of training, where a user has one.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlhf.prefixed import HF, RULE, argument

GOLD = "gold"
REWARD_MODEL = "rm"
GOLD_RULE = f"{RULE}gold"  # the gold judge as a reward function: task-suite prompts only
PREFIXES = (HF, RULE)  # judges named by an argument: hf:DIR, rule:NAME

DESCRIPTIONS = {
    GOLD: "the task suite's programmatic judge, playing the human labeler",
    REWARD_MODEL: "the trained reward model: the proxy the RL policies optimized, so it "
    "flatters them",
}


def invalid(judges: Sequence[str]) -> list[str]:
    """The names in `judges` that name no judge."""
    return [j for j in judges if j not in (GOLD, REWARD_MODEL) and argument(j, PREFIXES) is None]


def applicable(judges: Sequence[str], has_gold: bool) -> list[str]:
    """The judges that can judge these prompts: all but `gold` off the task suite."""
    return [j for j in judges if j != GOLD or has_gold]


def describe(judge: str) -> str:
    if (folder := argument(judge, (HF,))) is not None:
        return f"the reward model in {folder}, trained elsewhere"
    if (rule := argument(judge, (RULE,))) is not None:
        return f"the reward function {rule}"
    return DESCRIPTIONS[judge]


def slug(judge: str) -> str:
    """The judge's name as a file name part."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in judge).strip("_")
