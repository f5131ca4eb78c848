"""Gold-judged scores of a policy's answers, overall and per task family.

Per-family means are reported beside the overall mean so that an easy family cannot carry it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from rlhf.tasks import gold_score


def gold_summary(
    prompts: Sequence[str], tasks: Sequence[str], answers: Sequence[str]
) -> dict[str, object]:
    """{"mean": overall mean gold score, "by_task": {family: mean}, "scores": per answer}."""
    if not prompts:
        raise ValueError("no prompts to score")
    by_task: defaultdict[str, list[float]] = defaultdict(list)
    scores = []
    for prompt, task, answer in zip(prompts, tasks, answers, strict=True):
        score = gold_score(prompt, answer)
        scores.append(score)
        by_task[task].append(score)
    return {
        "mean": round(sum(scores) / len(scores), 4),
        "by_task": {t: round(sum(v) / len(v), 4) for t, v in sorted(by_task.items())},
        "scores": scores,
    }
