"""A stage's outputs, published all together or not at all.

Every declared output (outs, metrics, plots) is staged beside its target and moved into place
only once all of them are written (`rlhf.atomic.publication`): a failure on the way (a full
disk, a read-only `metrics/`) leaves every previous output as it was. A stage that starts
first clears what a killed run of it left half-written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rlhf.atomic import Publication, publication, remove_stale, write_csv, write_json
from rlhf.errors import OutputError
from rlhf.stages import paths
from rlhf.stages.specs import StageSpec


def begin(spec: StageSpec) -> None:
    """Remove the temporaries a killed run of this stage left beside its outputs and its
    resume state."""
    remove_stale([*spec.outputs, spec.resume_file])


@contextlib.contextmanager
def published(spec: StageSpec) -> Iterator[Publication]:
    """Stage every declared output of `spec` inside the block; all replace their targets
    when it ends, none if it raises. Leaving a declared output unwritten is a bug."""
    with publication() as staged:
        yield staged
        missing = sorted(str(p) for p in set(spec.outputs) - staged.targets)
        if missing:
            raise OutputError(f"stage {spec.address} wrote no {', '.join(missing)}")


def write_timings(
    stage: str, summary: dict[str, Any], steps: list[dict[str, Any]] | None = None
) -> None:
    """How fast the stage ran, to `timings/<stage>.json` (and per step to
    `timings/<stage>_steps.csv`), outside every DVC output.

    A rerun with the same params and seed reproduces every output byte for byte except its
    speed: were timings in the metrics files, each identical rerun would change their hashes
    in dvc.lock and lead `dvc metrics diff` with throughput "changes".
    """
    write_json(paths.timings_file(stage), summary)
    if steps:
        write_csv(paths.timing_steps_file(stage), steps)
