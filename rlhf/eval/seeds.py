"""How much the headline numbers move from seed to seed, and which changes stand out of that.

Float-order noise alone moves the reward model's gold accuracy by hundredths and a policy's KL
by a sixth; an experiment that changes one param moves them by as much. Runs of the same params
at several seeds give each number's spread; another run's value is then read against it: within
two standard deviations of the seeds' mean it is indistinguishable from noise.
"""

from __future__ import annotations

import fnmatch
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rlhf.eval.metric_keys import evaluated_policies

# metrics file (its name under metrics/, `{policy}` each evaluated policy) -> the keys a
# comparison shows: the stages' headline keys, which every recorded run has in git. Each
# policy's win rate over SFT sampled, each at its best temperature, greedy against greedy and
# against best-of-n of SFT at the nearest KL; its gold scores and KL to SFT; the reward
# model's accuracy
POLICY_FILE = "eval/{policy}"
COMPARED = {
    POLICY_FILE: ("win", "win_t", "win_greedy", "win_bon", "gold", "gold_greedy", "kl"),
    "rm": ("acc",),
}
NOISE_STDS = 2.0  # a value this many seed standard deviations from the mean is "within noise"
# Another CPU's run of the same params: its float rounding differs from the first SFT step on,
# which training compounds into what amounts to another seed, drawn once. Its numbers must lie
# within this many seed standard deviations of the mean (each at least MIN_STD), wide enough
# that three seeds' noisy standard deviation does not fail an honest run, narrow enough that
# a pipeline that stopped learning does (a policy no better than SFT, a reward model at chance).
OTHER_CPU_STDS = 4.0
# The least standard deviation a number is credited with. Three seeds estimate it with two
# degrees of freedom: one time in seven the estimate is under 40% of the truth, and of 25
# numbers some almost always are (all escape it one time in 50). A headline number's true
# spread is at least its evaluation's own sampling error (a win rate over 222 prompts: about
# 0.01) plus the training's; the default on an Intel Xeon (its seed 1234 another draw) put
# GRPO's `win` 4.5 of three AMD seeds' 0.0092 under their mean, and its deviation over the four
# runs is 0.024. At 0.02 every number of that run lies within 2.2
# (tests/unit/project/test_reproduction.py holds the run).
MIN_STD = 0.02
ROUNDING = 1e-9  # far below any metric's 4 decimals, far above a mean's float error


def compared_files(rl_algorithms: Sequence[str]) -> list[str]:
    """The metrics files a comparison reads of a run of `rl_algorithms`, by name."""
    names = (name.format(policy=p) for name in COMPARED for p in evaluated_policies(rl_algorithms))
    return list(dict.fromkeys(names))


def compared_numbers(metrics: Mapping[str, Mapping]) -> dict[str, float]:
    """The numbers a comparison shows, `eval/ppo:win` style (file, key), from the metrics
    files' contents (name -> parsed JSON)."""
    numbers: dict[str, float] = {}
    for name, contents in metrics.items():
        for pattern, keys in COMPARED.items():
            if fnmatch.fnmatchcase(name, pattern.format(policy="*")):
                wanted = [k for k in keys if isinstance(contents.get(k), int | float)]
                numbers |= {f"{name}:{k}": float(contents[k]) for k in wanted}
    return numbers


@dataclass(frozen=True)
class Spread:
    """One number across seeds."""

    mean: float
    std: float  # sample standard deviation; 0 with one seed
    low: float
    high: float
    seeds: int

    def within_noise(self, value: float) -> bool:
        """Within NOISE_STDS standard deviations of the mean, up to float rounding: a value
        every seed gave (std 0, the mean rounded off it) is noise, not a change."""
        return abs(value - self.mean) <= NOISE_STDS * self.std + ROUNDING

    def band(self, stds: float = OTHER_CPU_STDS) -> tuple[float, float]:
        """Where a run of the same params must land: within `stds` standard deviations of
        the mean, each at least MIN_STD (by default where another CPU's run must)."""
        width = stds * max(self.std, MIN_STD)
        return self.mean - width, self.mean + width


@dataclass(frozen=True)
class Reading:
    """One headline number of a run read against its spread over a baseline's seeds."""

    key: str  # `eval/ppo:win`
    spread: Spread
    value: float | None  # None: the run lacks it
    stds: float  # the band's half-width, in the spread's standard deviations

    @property
    def within(self) -> bool:
        low, high = self.spread.band(self.stds)
        return self.value is not None and low - ROUNDING <= self.value <= high + ROUNDING

    def failure(self) -> str:
        """Why it is not within, in a few words."""
        if self.value is None:
            return f"{self.key}: missing from this run's metrics"
        low, high = self.spread.band(self.stds)
        return f"{self.key}: {self.value:.4f} outside {low:.4f} – {high:.4f}"


def read_against(
    numbers: Mapping[str, float], spread: Mapping[str, Spread], stds: float
) -> list[Reading]:
    """Every number of the spread, as this run has it, against its band."""
    return [Reading(key, s, numbers.get(key), stds) for key, s in spread.items()]


def spreads(runs: Sequence[Mapping[str, float]]) -> dict[str, Spread]:
    """Each number's spread over `runs` (one per seed), for the numbers every run has."""
    shared = [k for k in runs[0] if all(k in run for run in runs)] if runs else []
    result = {}
    for key in shared:
        values = [run[key] for run in runs]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        result[key] = Spread(statistics.fmean(values), std, min(values), max(values), len(values))
    return result


def params_changed(params: Mapping[str, object], baseline: Mapping[str, object]) -> list[str]:
    """`key=value` for every flattened param that differs from the baseline's (seed too)."""
    keys = sorted(params.keys() | baseline.keys())
    return [f"{k}={params.get(k)}" for k in keys if params.get(k) != baseline.get(k)]
