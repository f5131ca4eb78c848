"""What a training stage (sft, rm, dpo, every RL algorithm) adds to its outputs: the curves it
logged while training, published with the rest, and its working state dropped once they are.

Kept apart from `outputs.py`, which every stage imports, so that only the training stages
depend on the curve log's code.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator

from rich.progress import Progress

from rlhf.atomic import Publication
from rlhf.project import paths
from rlhf.project.specs import StageSpec
from rlhf.stages.support.common import progress
from rlhf.stages.support.context import StageRun
from rlhf.train.curves import METRICS_FOLDER, Curves, NoCurves, curve_log


@contextlib.contextmanager
def reporting(stage: StageRun) -> Iterator[tuple[Progress, Curves]]:
    """The stage's progress bar and curve log while it trains: rank 0 alone shows and keeps
    them (every rank's numbers are the reduced, global ones)."""
    if not stage.world.is_main:
        yield progress(quiet=True), NoCurves()
        return
    with progress() as bar, curve_log(stage.spec.live_folder) as curves:
        yield bar, curves


def stage_curves(out: Publication, spec: StageSpec) -> None:
    """Stage the curves logged in the stage's live folder as its published curves."""
    shutil.copytree(spec.live_folder / METRICS_FOLDER, out[paths.curves_folder(spec.filed_as)])


def finish(spec: StageSpec) -> None:
    """Once the outputs are published: drop the resume state and the live curves."""
    spec.resume_file.unlink(missing_ok=True)
    shutil.rmtree(spec.live_folder, ignore_errors=True)
