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

from rlhf.eval.summary import flattened

# metrics file -> the keys a comparison shows (dotted, as `dvc metrics show` names them, each
# a glob): the stages' headline keys, which every recorded run has in git; each policy against
# SFT sampled, each at its best temperature, greedy against greedy and against best-of-n of
# SFT at the nearest KL (a run from before the baselines lacks those: compared without them)
COMPARED = {
    "eval": (
        "win_rate.gold.*_vs_sft",
        "win_rate_best_temperature.gold.*_vs_sft",
        "win_rate_greedy.gold.*_vs_sft",
        "win_rate_vs_best_of_n.gold.*",
        "gold_sampled.*",
        "gold_greedy.*",
        "gold_best_temperature.*",
        "best_temperature.*",
        "kl_to_sft.*",
    ),
    "rm": ("acc_gold",),
}
NOISE_STDS = 2.0  # a value this many seed standard deviations from the mean is "within noise"
# Another CPU's run of the same params: its float rounding differs from the first SFT step on,
# which training compounds into what amounts to another seed, drawn once. Its numbers must lie
# within this many seed standard deviations of the mean (each at least MIN_STD), wide enough
# that three seeds' noisy standard deviation does not fail an honest run, narrow enough that
# a pipeline that stopped learning does (a policy no better than SFT, a reward model at chance).
OTHER_CPU_STDS = 4.0
MIN_STD = 0.01
ROUNDING = 1e-9  # far below any metric's 4 decimals, far above a mean's float error


def compared_numbers(metrics: Mapping[str, Mapping]) -> dict[str, float]:
    """The numbers a comparison shows, `eval:win_rate.gold.ppo_vs_sft` style, from the
    metrics files' contents (name -> parsed JSON)."""
    numbers: dict[str, float] = {}
    for name, patterns in COMPARED.items():
        for key, value in flattened(name, metrics.get(name, {})).items():
            inner = key.split(".", 1)[1] if "." in key else key
            wanted = any(fnmatch.fnmatchcase(inner, pattern) for pattern in patterns)
            if wanted and isinstance(value, int | float):
                numbers[f"{name}:{inner}"] = float(value)
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

    def band(self) -> tuple[float, float]:
        """Where another CPU's run of the same params must land (OTHER_CPU_STDS)."""
        width = OTHER_CPU_STDS * max(self.std, MIN_STD)
        return self.mean - width, self.mean + width


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
