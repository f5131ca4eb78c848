"""Which of a stage's numbers DVC shows, and under which names.

`metrics/NAME.json` holds the headline numbers a user compares across runs, the ones
`dvc metrics show`, `dvc exp show` and `dvc metrics diff` read, under short keys (`loss`,
`acc`; evaluate writes one file per policy, `metrics/eval/ppo.json`, with `win`, `gold`,
`kl`, ...) so that the table they make fits a 120-column terminal with one row per file and a
column per key. Each stage declares them (`StageSpec.headline`: short key -> the number's
full dotted path). Everything the stage measured, those numbers included under their full
names (`win_rate.gold.ppo_vs_sft`), goes to `metrics/details/NAME.json`, an output DVC keeps
in its cache like a model (an uncached output that is not a metric would keep the stage out of
DVC's run cache) and its metrics views do not read. The report, the Prefect artifacts and
docs/results.py read the details; `rlhf compare` the headline files, which git holds for every
recorded run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlhf.project import paths

Metrics = dict[str, Any]


def headline_view(metrics: Metrics, headline: Mapping[str, str], **fields: str) -> Metrics:
    """The numbers `headline` names (short key -> dotted path), under their short keys. A
    path is filled with `fields` (`{policy}`) and each of its parts may list alternatives,
    the first one measured taken (`win_rate.gold|rm.{policy}_vs_sft`: the gold judge's, else
    the reward model's); a number the run did not measure (absent, or None) is left out."""
    shown: Metrics = {}
    for key, path in headline.items():
        here: Any = metrics
        for part in path.format(**fields).split("."):
            options = here if isinstance(here, dict) else {}
            found = [a for a in part.split("|") if options.get(a) is not None]
            if not found:
                break
            here = here[found[0]]
        else:
            shown[key] = here
    return shown


def read_metrics(name: str, root: Path = Path()) -> Metrics:
    """Everything stage output NAME (`sft`, `ppo`, `eval`) measured: its details file."""
    return json.loads((root / paths.details_file(name)).read_text())
