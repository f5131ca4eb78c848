"""A checker judge's numbers: accuracy with its interval, greedy accuracy and pass@k."""

from itertools import combinations

import pytest

from rlhf.eval.answers import ScoredAnswers
from rlhf.eval.checked import checked_metrics, ks
from rlhf.eval.report import checked_table

JUDGE = "check:last_number"


def answers(right: list[list[int]]) -> ScoredAnswers:
    """Answers to len(right) prompts, right[p][s] telling whether sample s of prompt p is."""
    index = [p for p, samples in enumerate(right) for _ in samples]
    n = len(index)
    return ScoredAnswers(
        prompt_index=index, prompts=[f"q{p}" for p in index], tasks=["add"] * n,
        responses=["a"] * n, gold=None, reward=[0.0] * n, kl=[0.0] * n, kl_sampled=[0.0] * n,
        length=[1] * n, ended=[True] * n,
        other_judges={JUDGE: [float(r) for samples in right for r in samples]},
    )  # fmt: skip


def brute_pass_at(right: list[list[int]], k: int) -> float:
    """Over prompts, the share of k-subsets of a prompt's samples holding a right one."""
    shares = []
    for samples in right:
        subsets = list(combinations(samples, k))
        shares.append(sum(any(s) for s in subsets) / len(subsets))
    return sum(shares) / len(shares)


def test_pass_at_k_and_accuracy_match_a_brute_force_count():
    right = [[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 1], [0, 1, 0, 0]]
    found = {"sampled": {"sft": answers(right)}, "greedy": {"sft": answers([[1], [0], [1], [1]])}}
    metrics = checked_metrics(found, ["gold", JUDGE], resamples=200, seed=0)
    assert metrics["accuracy"][JUDGE]["sft"] == 5 / 16
    assert metrics["accuracy_greedy"][JUDGE]["sft"] == 0.75
    passes = metrics["pass_at_k"][JUDGE]["sft"]
    assert list(passes) == ["1", "2", "4"]
    for k, value in passes.items():
        assert value == pytest.approx(brute_pass_at(right, int(k)), abs=1e-4)
    ci = metrics["accuracy_ci95"][JUDGE]["sft"]
    assert 0 <= ci["low"] < 5 / 16 < ci["high"] <= 1


def test_without_a_checker_among_the_judges_nothing_is_added():
    found = {"sampled": {"sft": answers([[1, 0]])}, "greedy": {"sft": answers([[1]])}}
    assert checked_metrics(found, ["gold", "rm"], resamples=10, seed=0) == {}


def test_a_format_reward_is_not_a_right_answer():
    """With `format_reward`, a wrong answer in the right shape scores above 0 but is wrong."""
    found = answers([[1, 0]])
    found.other_judges[JUDGE] = [1.0, 0.1]
    metrics = checked_metrics({"sampled": {"p": found}, "greedy": {"p": found}}, [JUDGE], 10, 0)
    assert metrics["accuracy"][JUDGE]["p"] == 0.5
    assert metrics["pass_at_k"][JUDGE]["p"] == {"1": 0.5, "2": 1.0}


@pytest.mark.parametrize(("samples", "expected"), [(1, [1]), (4, [1, 2, 4]), (6, [1, 2, 4, 6])])
def test_pass_at_k_is_reported_at_powers_of_two_and_all_samples(samples, expected):
    assert ks(samples) == expected


def test_the_report_tabulates_accuracy_and_pass_at_k_per_policy():
    right = [[1, 0], [0, 0]]
    found = {"sampled": {"sft": answers(right)}, "greedy": {"sft": answers([[1], [0]])}}
    metrics = {"prompts": 2, **checked_metrics(found, [JUDGE], resamples=50, seed=0)}
    lines = checked_table(metrics, JUDGE)
    assert lines[0] == (
        "| policy | accuracy, sampled | 95% interval | accuracy, greedy | pass@1 | pass@2 |"
    )
    assert lines[2] == "| sft | 0.250 | 0.000 – 0.500 (n = 2) | 0.500 | 0.250 | 0.500 |"
