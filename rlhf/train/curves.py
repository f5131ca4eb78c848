"""Training curves, logged step by step through dvclive, DVC's own logger.

Each metric goes to its own `plots/metrics/NAME.tsv` (columns `step` and NAME) under the
folder the curve log writes, the layout `dvc plots show`, the VS Code extension and DVC Studio
read. dvclive runs where DVC runs the stage (`DVC_ROOT` names the repository): elsewhere it
would look for a DVC repository upwards, or `dvc init` one. There, and without dvclive (a GPU
host without DVC), `TsvCurves` writes the same files byte for byte, so where a stage runs
never changes an output.

Points are appended as they happen; dvclive's summary is rewritten at most every
`SYNC_EVERY_S`, and only with a Studio token does a sync also post to Studio, since that
re-reads every curve file (time quadratic in the steps of a long run, were it each step).
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

METRICS_FOLDER = Path("plots/metrics")  # where a curve log's TSVs go, under its folder
SYNC_EVERY_S = 10.0

Point = Mapping[str, float]  # metric name -> its value at one step


class Curves(Protocol):
    def log(self, step: int, values: Point) -> None:
        """Append each value to its metric's curve at `step`."""


class LiveCurves:
    """Curves through a `dvclive.Live` that writes no dvc.yaml and saves no experiment: the
    stage's DVC declarations (`rlhf.project.specs`) and `dvc exp run` do both."""

    def __init__(self, folder: Path) -> None:
        from dvclive.studio import get_dvc_studio_config

        from dvclive import Live

        self.live = Live(dir=str(folder), dvcyaml=None, save_dvc_exp=False)
        self.to_studio = bool(get_dvc_studio_config(self.live))
        self.synced = time.monotonic()

    def log(self, step: int, values: Point) -> None:
        self.live.step = step
        for name, value in values.items():
            self.live.log_metric(name, value)
        if time.monotonic() - self.synced >= SYNC_EVERY_S:
            self.live.sync() if self.to_studio else self.live.make_summary()
            self.synced = time.monotonic()

    def close(self) -> None:
        self.live.make_summary()  # `end` takes its step from the summary
        self.live.end()


class TsvCurves:
    """dvclive's metric files, written the way `dvclive.plots.Metric` writes them."""

    def __init__(self, folder: Path) -> None:
        self.metrics = folder / METRICS_FOLDER

    def log(self, step: int, values: Point) -> None:
        for name, value in values.items():
            path = self.metrics / f"{name}.tsv"
            path.parent.mkdir(parents=True, exist_ok=True)
            row = {"step": step, os.path.basename(name): value}
            existed = path.exists()
            with open(path, "a", encoding="utf-8", newline="") as handle:
                writer = csv.DictWriter(
                    handle, row.keys(), delimiter="\t", lineterminator=os.linesep
                )
                if not existed:
                    writer.writeheader()
                writer.writerow(row)

    def close(self) -> None:
        """Every row is on disk once `log` returns."""


class NoCurves:
    """A curve log that keeps nothing: a data-parallel rank other than 0, whose points are
    rank 0's."""

    def log(self, step: int, values: Point) -> None:
        """Nothing to keep."""


def live_curves(folder: Path) -> LiveCurves | None:
    """dvclive's curves, or None in a git repository without a commit: dvclive 3.49 reads
    HEAD there and fails, and with no commit there is no experiment to stream to Studio,
    the one thing dvclive adds to the files `TsvCurves` writes."""
    from scmrepo.exceptions import SCMError

    try:
        return LiveCurves(folder)
    except SCMError:
        return None


def dvclive_applies() -> bool:
    """Whether DVC runs this stage and dvclive is installed."""
    if not os.environ.get("DVC_ROOT"):
        return False
    try:
        import dvclive  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def curve_log(folder: Path, *, use_dvclive: bool | None = None) -> Iterator[Curves]:
    """A fresh curve log writing under `folder` (what an earlier run left there is removed);
    through dvclive where `dvclive_applies`, unless `use_dvclive` says otherwise."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    live = dvclive_applies() if use_dvclive is None else use_dvclive
    curves = (live_curves(folder) if live else None) or TsvCurves(folder)
    (folder / METRICS_FOLDER).mkdir(parents=True, exist_ok=True)  # published even if empty
    try:
        yield curves
    finally:
        curves.close()


def read_curve(folder: Path, name: str) -> list[tuple[int, float]]:
    """The (step, value) points of metric `name` in a folder of curves (`METRICS_FOLDER` of
    a curve log, or its published copy)."""
    with open(folder / f"{name}.tsv", encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t"))[1:]
    return [(int(step), float(value)) for step, value in rows]
