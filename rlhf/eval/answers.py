"""What was measured on each answer of one policy to the evaluation prompts.

Apart from the sampling (`rlhf.eval.policies`) so that what only reads these measures, the
report and the baselines it tabulates, and the Prefect flows that publish the report, load
without torch: each flow-run process imports them, and torch would add seconds to every one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from rlhf.reward_sources import GOLD, REWARD_MODEL

# summary name -> per-answer field
MEASURES = {
    "gold": "gold",
    "reward": "reward",
    "kl": "kl",
    "kl_sampled": "kl_sampled",
    "length": "length",
    "end_token_rate": "ended",
}


@dataclass
class ScoredAnswers:
    """One policy's answers to the evaluation prompts, with what was measured on each."""

    prompt_index: list[int]  # which evaluation prompt each answer answers
    prompts: list[str]  # that prompt
    tasks: list[str]
    responses: list[str]
    gold: list[float] | None  # None when the prompts have no gold judge
    reward: list[float]  # reward model, normalized as PPO sees it
    kl: list[float]  # to the reference policy, exact over the vocabulary
    kl_sampled: list[float]  # the sampled estimate of the same
    length: list[int]
    ended: list[bool]
    other_judges: dict[str, list[float]] = field(default_factory=dict)  # hf:DIR, rule:NAME

    def take(self, rows: Sequence[int]) -> ScoredAnswers:
        """These answers' rows `rows`, in that order, with everything measured on them."""

        def pick(values: Sequence[Any]) -> list[Any]:
            return [values[i] for i in rows]

        measured = {
            f.name: pick(getattr(self, f.name))
            for f in fields(self)
            if f.name != "other_judges" and getattr(self, f.name) is not None
        }
        judges = {name: pick(scores) for name, scores in self.other_judges.items()}
        return replace(self, **measured, other_judges=judges)

    def judged_by(self, judge: str) -> list[float]:
        """Each answer's score by `judge`: gold, the reward model (`rm`) or another judge."""
        scores = {GOLD: self.gold, REWARD_MODEL: self.reward}.get(judge)
        return self.other_judges[judge] if scores is None else scores

    def _mean(self, measure: str, rows: Sequence[int]) -> float | None:
        values = getattr(self, MEASURES[measure])
        if values is None:
            return None
        return round(sum(float(values[i]) for i in rows) / len(rows), 4)

    def means(self) -> dict[str, float | None]:
        """Every measure averaged over all answers."""
        rows = range(len(self.responses))
        return {m: self._mean(m, rows) for m in MEASURES}

    def by_task(self) -> dict[str, dict[str, float | None]]:
        """Every measure averaged within each task family."""
        rows: defaultdict[str, list[int]] = defaultdict(list)
        for i, task in enumerate(self.tasks):
            rows[task].append(i)
        return {t: {m: self._mean(m, r) for m in MEASURES} for t, r in sorted(rows.items())}
