"""Which of a stage's numbers DVC shows.

`metrics/NAME.json` holds the headline numbers a user compares across runs, the ones
`dvc metrics show`, `dvc exp show` and `dvc metrics diff` read; each stage declares them
(`StageSpec.headline`). Everything else it measured (per-task breakdowns, intervals, counts,
the other judges, an RL run's own training summary) goes to `metrics/details/NAME.json`, an
output DVC keeps in its cache like a model (an uncached output that is not a metric would keep
the stage out of DVC's run cache) and its metrics views do not read. The report, the Prefect
artifacts and docs/results.py read both, merged; `rlhf compare` compares headline numbers.
"""

from __future__ import annotations

import copy
import fnmatch
import json
from pathlib import Path
from typing import Any

from rlhf.stages.support import paths

Metrics = dict[str, Any]


def split(metrics: Metrics, headline: tuple[str, ...]) -> tuple[Metrics, Metrics]:
    """(the headline keys of `metrics`, everything else). A headline key is a dotted path
    whose last part may be a glob and whose other parts may name alternatives, the first
    measured one taken (`win_rate.gold|rm.*_vs_sft`: the gold judge's, else the reward
    model's); one the stage did not measure is left out. What the stage wrote stays as it
    wrote it: only the dicts a move leaves empty are dropped."""
    shown: Metrics = {}
    rest = copy.deepcopy(metrics)
    for key in headline:
        *parents, pattern = key.split(".")
        path, here = [], rest
        for part in parents:
            name = next((a for a in part.split("|") if isinstance(here.get(a), dict)), None)
            if name is None:
                break
            path.append(name)
            here = here[name]
        else:
            moved = {name: here.pop(name) for name in fnmatch.filter(list(here), pattern)}
            if moved:
                _nested(shown, path).update(moved)
                _prune(rest, path)
    return shown, rest


def merged(headline: Metrics, details: Metrics) -> Metrics:
    """The metrics as the stage measured them, from its two files, keys sorted at every
    level as in one metrics file (tables list pairs in that order)."""
    whole = copy.deepcopy(headline)
    for key, value in details.items():
        if isinstance(value, dict) and isinstance(whole.get(key), dict):
            whole[key] = merged(whole[key], value)
        else:
            whole[key] = value
    return {key: whole[key] for key in sorted(whole)}


def read_metrics(name: str, root: Path = Path()) -> Metrics:
    """Everything stage output NAME (`sft`, `ppo`, `eval`) measured: its metrics file and
    its details merged, either of which may be missing (an RL stage's headline is evaluate's;
    a run from before the split has no details)."""
    parts = [root / paths.metrics_file(name), root / paths.details_file(name)]
    found = [json.loads(p.read_text()) for p in parts if p.exists()]
    if not found:
        raise FileNotFoundError(f"no {parts[0]} or {parts[1]}")
    whole: Metrics = {}
    for part in found:
        whole = merged(whole, part)
    return whole


def _nested(tree: Metrics, path: list[str]) -> Metrics:
    """The dict at `path` in `tree`, made where missing."""
    for name in path:
        tree = tree.setdefault(name, {})
    return tree


def _prune(tree: Metrics, path: list[str]) -> None:
    """Drop the dicts along `path` that a move left empty, innermost first."""
    if path:
        _prune(tree[path[0]], path[1:])
        if not tree[path[0]]:
            del tree[path[0]]
