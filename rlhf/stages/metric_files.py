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

from rlhf.stages import paths

Metrics = dict[str, Any]


def split(metrics: Metrics, headline: tuple[str, ...]) -> tuple[Metrics, Metrics]:
    """(the headline keys of `metrics`, everything else). A headline key is a dotted path
    whose last part may be a glob (`win_rate.gold.*_vs_sft`); one the stage did not measure
    (a judge it was not given) is left out."""
    shown: Metrics = {}
    rest = copy.deepcopy(metrics)
    for key in headline:
        *parents, pattern = key.split(".")
        source, target = rest, shown
        for part in parents:
            source = source.get(part, {})
            target = target.setdefault(part, {})
        for name in fnmatch.filter(list(source), pattern):
            target[name] = source.pop(name)
    return _without_empty(shown), _without_empty(rest)


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


def _without_empty(tree: Metrics) -> Metrics:
    kept = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            value = _without_empty(value)
            if not value:
                continue
        kept[key] = value
    return kept
