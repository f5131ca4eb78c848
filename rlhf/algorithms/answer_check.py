"""Checking an answer against its reference: the reward of a question with one right answer
(GSM8K, MATH, the task suite's additions) and the accuracy and pass@k of its evaluation.

An extractor finds the answer's final answer; the check compares it with the reference,
numbers as numbers (`1,234`, `1234.0` and `+1234` are one number; `0.1 + 0.2` is never
rounded, since numbers are exact fractions), other text after light normalization (case,
spacing, a trailing period). Model output is untrusted text: every function here returns a
value for any string, never raises, and runs in time linear in its length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction

# A number as people write it: a sign only where it cannot be an operator (not after a word
# character or a closing bracket: `3-5` is two numbers), thousands separated by commas, a
# decimal part, an exponent.
NUMBER = re.compile(
    r"(?:(?<![\w)\]])[-+\u2212])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"
    r"|(?:(?<![\w)\]])[-+\u2212])?\.\d+"
)
GSM8K_MARK = "####"
BOXED = "\\boxed{"
FRACTION = re.compile(r"\\d?frac\{([^{}]*)\}\{([^{}]*)\}")


def last_number(text: str) -> str | None:
    """The last number in the text, as written."""
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else None


def after_gsm8k_mark(text: str) -> str | None:
    """GSM8K's convention: what follows the last `####`, its first number if it has one."""
    if GSM8K_MARK not in text:
        return None
    tail = text.rsplit(GSM8K_MARK, 1)[1].strip()
    number = NUMBER.search(tail)
    return number.group() if number else (tail.splitlines()[0].strip() if tail else None)


def boxed(text: str) -> str | None:
    """MATH's convention: the contents of the last `\\boxed{...}`, braces balanced."""
    start = text.rfind(BOXED)
    if start < 0:
        return None
    depth, begin = 1, start + len(BOXED)
    for end in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[begin:end].strip()
    return None  # never closed: no final answer


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "last_number": last_number,
    "gsm8k": after_gsm8k_mark,
    "boxed": boxed,
}


def as_number(text: str) -> Fraction | None:
    """The exact value of a written number (`-1,234.50`, `$12`, `50%` as 50, `\\frac{1}{2}`,
    `3/4`), or None when the text is not one number."""
    cleaned = FRACTION.sub(r"(\1)/(\2)", text.strip())
    cleaned = cleaned.replace("\u2212", "-").replace(",", "").replace("$", "").rstrip("%.")
    cleaned = cleaned.replace(" ", "").replace("(", "").replace(")", "")
    exponent = cleaned.lower().partition("e")[2].lstrip("+-")
    if not cleaned or len(cleaned) > 100 or len(exponent) > 3:  # 1e999999: not an answer
        return None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def normalized(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".")


def same_answer(extracted: str, reference: str) -> bool:
    """Whether an extracted final answer is the reference: as numbers when both are one."""
    ours, theirs = as_number(extracted), as_number(reference)
    if ours is not None and theirs is not None:
        return ours == theirs
    return normalized(extracted) == normalized(reference)


def reward(answer: str, reference: str, extractor: str, format_reward: float = 0.0) -> float:
    """1 for the right final answer; `format_reward` for a wrong one the extractor found (the
    answer kept the format), 0 for none."""
    extracted = EXTRACTORS[extractor](answer)
    if extracted is None:
        return 0.0
    return 1.0 if same_answer(extracted, reference) else format_reward


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased estimate of pass@k from n answers of which `correct` are right (Chen et
    al. 2021): the chance that k drawn without replacement hold a right one, 1 - C(n - c, k)
    / C(n, k), as a product that neither overflows nor cancels."""
    if not 0 <= correct <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= correct <= n and 1 <= k <= n, got {n=}, "
                         f"{correct=}, {k=}")  # fmt: skip
    if n - correct < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - correct + 1, n + 1))


def check(answer: str, reference: str, extractor: str = "last_number") -> bool:
    """Whether `answer`'s final answer, as `extractor` finds it, is `reference`; False when it
    has none."""
    return reward(answer, reference, extractor) == 1.0
