"""Canary runs: whether a run's headline numbers drifted from a committed baseline.

A baseline is what `rlhf compare --json` prints (docs/seeds.json is the default's): each
headline number's mean and standard deviation over runs of the same params at several seeds.
A run of those params whose number leaves mean ± `stds` standard deviations (each at least
`seeds.MIN_STD`) has drifted: the code, the data, a dependency or the machine changed what the
pipeline produces by more than a seed does. `rlhf compare --baseline FILE` and the pipeline
flow's `baseline` parameter (the scheduled deployment's canary) give the same verdict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf.errors import PipelineError
from rlhf.eval.seeds import Reading, Spread, compared_numbers, read_against
from rlhf.project.experiments import read_run

DEFAULT_STDS = 4.0  # wide enough for three seeds' noisy std, as `rlhf reproduced` on another CPU
SPREAD_FIELDS = ("mean", "std", "low", "high", "seeds")


class BaselineError(PipelineError):
    """A baseline file that is missing or not `rlhf compare --json` output."""


def read_baseline(path: Path) -> dict[str, Spread]:
    """The spread a baseline file (`rlhf compare --json` output) holds, by headline number; a
    BaselineError naming the file and the key where it is not one."""
    try:
        payload: Any = json.loads(path.read_text())
    except FileNotFoundError:
        raise BaselineError(
            f"{path}: no such baseline file: write one with `rlhf compare --json > {path}` "
            "after `rlhf seeds` has run the pipeline at several seeds"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BaselineError(f"{path}: not JSON ({error})") from None
    spread = payload.get("spread") if isinstance(payload, dict) else None
    if not isinstance(spread, dict) or not spread:
        raise BaselineError(
            f"{path}: key 'spread': missing or empty; a baseline is `rlhf compare --json` "
            "output over at least one seed"
        )
    found = {}
    for key, value in spread.items():
        fields = value if isinstance(value, dict) else {}
        numeric = all(
            isinstance(fields.get(f), int | float) and not isinstance(fields.get(f), bool)
            for f in SPREAD_FIELDS
        )
        if not numeric or fields["std"] < 0:
            raise BaselineError(
                f"{path}: key 'spread.{key}': must hold the numbers {', '.join(SPREAD_FIELDS)} "
                f"(std at least 0), not {json.dumps(value)[:80]}"
            )
        found[key] = Spread(**{f: fields[f] for f in SPREAD_FIELDS})
    return found


@dataclass(frozen=True)
class Drift:
    """A run read against a baseline: every number's reading, and the ones outside."""

    baseline: Path
    readings: list[Reading]

    @property
    def failures(self) -> list[str]:
        return [reading.failure() for reading in self.readings if not reading.within]

    def reason(self) -> str:
        """One line: what drifted, or that nothing did."""
        stds = self.readings[0].stds
        if not self.failures:
            return f"within {stds:g} std of the baseline {self.baseline} on every number"
        return f"drifted from the baseline {self.baseline} ({stds:g} std): " + "; ".join(
            self.failures
        )

    def rows(self) -> list[dict[str, str]]:
        """The table a person reads: number, baseline mean ± std, this run, verdict."""
        return [
            {
                "number": r.key,
                "baseline": f"{r.spread.mean:.4f} ± {r.spread.std:.4f} ({r.spread.seeds} seeds)",
                "this run": "–" if r.value is None else f"{r.value:.4f}",
                "verdict": "within" if r.within else "drift",
            }
            for r in self.readings
        ]


def check(root: Path, baseline: Path, stds: float = DEFAULT_STDS) -> Drift:
    """The run in `root` (its metrics files) against the baseline file (relative to root)."""
    spread = read_baseline(root / baseline)
    # a metrics file the run lacks: each of its numbers missing
    _, metrics = read_run(lambda p: (root / p).read_text() if (root / p).exists() else "{}")
    return Drift(baseline, read_against(compared_numbers(metrics), spread, stds))
