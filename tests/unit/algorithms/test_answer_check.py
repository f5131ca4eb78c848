"""The answer checker: final answers found as GSM8K, MATH and plain text write them, compared
with the reference as numbers; pass@k against counting every draw."""

from __future__ import annotations

import itertools
import time
from fractions import Fraction

import pytest

from rlhf.algorithms.answer_check import (
    as_number,
    check,
    last_number,
    pass_at_k,
    reward,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("6 + 7 = 13.", "13"),
        ("It costs $1,234.50 in all", "1,234.50"),
        ("The temperature fell to -5 degrees.", "-5"),
        ("x = \u221212", "\u221212"),
        ("3-5 is an expression, not a negative", "5"),
        ("(2)-3", "3"),
        ("about .5 of them", ".5"),
        ("1e3 grams", "1e3"),
        ("12,34", "34"),  # not a thousands separator
        ("no number here", None),
        ("", None),
    ],
)
def test_the_last_number_as_written(text, expected):
    assert last_number(text) == expected


@pytest.mark.parametrize(
    ("answer", "reference", "extractor", "right"),
    [
        ("She has 5 + 3 = 8 apples.\n#### 8", "8", "gsm8k", True),
        ("#### 1,000", "1000", "gsm8k", True),
        ("#### -7", "-7", "gsm8k", True),
        ("So 8 apples. #### 9", "8", "gsm8k", False),  # the mark, not the last number
        ("8 apples, no mark", "8", "gsm8k", False),
        ("The answer is \\boxed{\\frac{1}{2}}.", "0.5", "boxed", True),
        ("\\boxed{3/4}", "0.75", "boxed", True),
        ("\\boxed{ New  Delhi }", "new delhi.", "boxed", True),  # text: case, spaces, period
        ("\\boxed{2} then \\boxed{3}", "3", "boxed", True),  # the last one
        ("\\boxed{unclosed", "unclosed", "boxed", False),
        ("The total is 1,234.", "1234", "last_number", True),
        ("1234.0", "1,234", "last_number", True),
        ("+42", "42", "last_number", True),
        ("0.1 and 0.2 make 0.3", "0.3", "last_number", True),  # exact, never floats
        ("it is 3.", "3.5", "last_number", False),
        ("nothing at all", "3", "last_number", False),
        ("The capital is Madrid.", "madrid", "gsm8k", False),  # no mark: no final answer
    ],
)
def test_a_final_answer_is_compared_with_the_reference(answer, reference, extractor, right):
    assert check(answer, reference, extractor) is right


def test_the_reward_pays_the_format_of_a_wrong_answer_only_when_asked():
    assert reward("#### 8", "8", "gsm8k") == 1.0
    assert reward("#### 9", "8", "gsm8k") == 0.0
    assert reward("#### 9", "8", "gsm8k", format_reward=0.1) == 0.1
    assert reward("nine", "8", "gsm8k", format_reward=0.1) == 0.0  # no final answer at all


@pytest.mark.parametrize(
    ("text", "value"),
    [("-1,234.50", Fraction(-2469, 2)), ("$12", 12), ("50%", 50), ("\\frac{1}{4}", 0.25),
     ("1e3", 1000), ("1/0", None), ("1e99999", None), ("nan", None), ("inf", None),
     ("3 apples", None), ("-", None)],
)  # fmt: skip
def test_a_written_number_has_its_exact_value_or_none(text, value):
    assert as_number(text) == value


@pytest.mark.parametrize(
    ("hostile", "right"),
    [("9" * 100_000, ()),  # a 100,000-digit number is no number: compared as text
     ("\\boxed{" * 50_000, ()), ("{" * 100_000 + "\\boxed{", ()),  # never closed
     ("1," * 100_000, ("last_number",)),  # not thousands: the last number is 1
     ("-" * 100_000 + "1", ()),  # -1
     ("#### " + "1e" * 50_000, ())],  # 1e1 after the mark: 10
)  # fmt: skip
def test_untrusted_text_is_checked_in_linear_time_without_raising(hostile, right):
    started = time.perf_counter()
    found = {e: check(hostile, "1", e) for e in ("last_number", "gsm8k", "boxed")}
    assert time.perf_counter() - started < 2.0
    assert found == {e: e in right for e in found}


def brute_force_pass_at_k(n: int, correct: int, k: int) -> float:
    """Every k-subset of n answers, the first `correct` right: the share holding one."""
    draws = list(itertools.combinations(range(n), k))
    return sum(any(i < correct for i in draw) for draw in draws) / len(draws)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_share_of_k_draws_holding_a_right_answer(n):
    for correct in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, correct, k) == pytest.approx(
                brute_force_pass_at_k(n, correct, k), abs=1e-12
            ), (n, correct, k)


def test_pass_at_k_refuses_impossible_counts():
    for n, correct, k in [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)]:
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(n, correct, k)
