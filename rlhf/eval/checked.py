"""What a checker judge (`check:EXTRACTOR`) measures of each policy: the share of its answers
whose final answer is the reference (accuracy), sampled with a bootstrap interval over prompts
and greedy, and pass@k, the chance that k of a prompt's sampled answers hold a right one.

Accuracy and pass@k are what a user of verifiable rewards reads (GSM8K, MATH); win rates by the
checker say less, since two right answers tie. pass@k uses the unbiased estimator over the
`evaluate.samples` answers per prompt (Chen et al. 2021), for k = 1, 2, 4, ... up to them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from rlhf.algorithms.answer_check import pass_at_k
from rlhf.eval.answers import ScoredAnswers
from rlhf.eval.win_rates import bootstrap_interval
from rlhf.reward_sources import JUDGES, parse


def checker_judges(judges: Sequence[str]) -> list[str]:
    """The judges among `judges` that check answers against references."""
    return [judge for judge in judges if parse(judge, JUDGES).needs_references]


def ks(samples: int) -> list[int]:
    """The k of pass@k reported for `samples` answers per prompt: powers of 2, and all."""
    return sorted({2**i for i in range(samples.bit_length()) if 2**i <= samples} | {samples})


def pass_at(answers: ScoredAnswers, judge: str) -> dict[str, float]:
    """pass@k by k (as text, a metrics key) over the prompts, each prompt's right answers
    counted among its sampled ones; every prompt must have the same number of answers."""
    right: defaultdict[int, list[bool]] = defaultdict(list)
    for prompt, score in zip(answers.prompt_index, answers.judged_by(judge), strict=True):
        right[prompt].append(score == 1.0)
    counts = {len(found) for found in right.values()}
    if len(counts) != 1:
        raise ValueError(f"pass@k needs as many answers per prompt, got {sorted(counts)}")
    n = counts.pop()
    return {
        str(k): round(sum(pass_at_k(n, sum(found), k) for found in right.values()) / len(right), 4)
        for k in ks(n)
    }


def accuracy(answers: ScoredAnswers, judge: str) -> float:
    """The share of answers the checker finds right."""
    scores = answers.judged_by(judge)
    return round(sum(score == 1.0 for score in scores) / len(scores), 4)


def checked_metrics(
    answers: Mapping[str, Mapping[str, ScoredAnswers]],
    judges: Sequence[str],
    resamples: int,
    seed: int,
) -> dict[str, Any]:
    """`accuracy`, `accuracy_ci95`, `accuracy_greedy` and `pass_at_k`, each by checker judge
    and policy ({} without a checker among `judges`). `answers`: {"sampled" | "greedy":
    {policy: its answers}}."""
    checkers = checker_judges(judges)
    if not checkers:
        return {}
    sampled, greedy = answers["sampled"], answers["greedy"]

    def interval(found: ScoredAnswers, judge: str) -> dict[str, float | None]:
        right = [float(score == 1.0) for score in found.judged_by(judge)]
        low, high = bootstrap_interval(right, found.prompt_index, resamples=resamples, seed=seed)
        assert low is not None and high is not None  # unweighted: every resample has a mean
        return {"low": round(low, 4), "high": round(high, 4)}

    return {
        "accuracy": {j: {n: accuracy(a, j) for n, a in sampled.items()} for j in checkers},
        "accuracy_ci95": {j: {n: interval(a, j) for n, a in sampled.items()} for j in checkers},
        "accuracy_greedy": {j: {n: accuracy(a, j) for n, a in greedy.items()} for j in checkers},
        "pass_at_k": {j: {n: pass_at(a, j) for n, a in sampled.items()} for j in checkers},
    }
