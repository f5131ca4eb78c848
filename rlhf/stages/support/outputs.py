"""A stage's outputs, published all together or not at all.

Every declared output (outs, metrics, plots) is staged beside its target and moved into place
only once all of them are written (`rlhf.atomic.publication`): a failure on the way (a full
disk, a read-only `metrics/`) leaves every previous output as it was. A stage that starts
first clears what a killed run of it left half-written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from rlhf.atomic import Publication, publication, remove_stale, write_csv, write_json
from rlhf.errors import OutputError, PipelineError
from rlhf.locks import try_lock
from rlhf.project import paths
from rlhf.project.metric_files import headline_view
from rlhf.project.specs import StageSpec
from rlhf.stages.support.tracking import track


class StageBusy(PipelineError):
    """Another process runs this stage now."""


STAGE_LOCKS = Path(".rlhf") / "locks"  # one lock file per stage address, e.g. rl@ppo.lock
_held: dict[str, IO[str]] = {}  # this process's stage locks, by lock file


def begin(spec: StageSpec) -> None:
    """Hold the stage, then remove the temporaries a killed run of it left beside its
    outputs and its resume state."""
    hold(spec)
    remove_stale([*spec.outputs, spec.resume_file])


def hold(spec: StageSpec) -> None:
    """One run of a stage at a time, however each was started (`dvc repro`, `python -m`,
    `rlhf`): a second would delete the first's temporaries and race it to the outputs, so it
    is refused in one line. Held until the run ends (`release_stages`, which every entry
    point calls) or the process does; a process runs a stage again under the lock it holds."""
    file = STAGE_LOCKS / f"{spec.address}.lock"
    if str(file.resolve()) in _held:
        return
    handle = try_lock(file)
    if handle is None:
        raise StageBusy(
            f"stage {spec.address} is already running (another process holds {file}); wait "
            "for it to end, or stop it"
        )
    _held[str(file.resolve())] = handle


def release_stages() -> None:
    """Release the stage locks this process holds: its run has ended."""
    while _held:
        _held.popitem()[1].close()


@contextlib.contextmanager
def published(spec: StageSpec) -> Iterator[Publication]:
    """Stage every declared output of `spec` inside the block; all replace their targets
    when it ends, none if it raises. Leaving a declared output unwritten is a bug."""
    with publication() as staged:
        yield staged
        missing = sorted(str(p) for p in set(spec.outputs) - staged.targets)
        if missing:
            raise OutputError(f"stage {spec.address} wrote no {', '.join(missing)}")
    track(spec)  # published: what the tracker logs is the stage's outputs


def write_metrics(
    out: Publication, spec: StageSpec, metrics: dict[str, Any], policies: Sequence[str] = ()
) -> None:
    """What a stage measured: all of it to its details file, its headline numbers under their
    short keys to its metrics file, or with `policies` to one file per policy in its metrics
    folder (`metric_files.py`)."""
    if spec.details is None:
        raise OutputError(f"stage {spec.address} declares no details file for {sorted(metrics)}")
    write_json(out[spec.details], metrics)
    for target in spec.metrics:
        if not policies:
            write_json(out[target], headline_view(metrics, spec.headline))
            continue
        out[target].mkdir()
        for policy in policies:
            shown = headline_view(metrics, spec.headline, policy=policy)
            write_json(out[target] / f"{policy}.json", shown)


def write_timings(
    stage: str, summary: dict[str, Any], steps: list[dict[str, Any]] | None = None
) -> None:
    """How fast the stage ran, and on what (CPU threads, processes, the CPU's signature with
    the kernels the stage allowed itself), to `timings/<stage>.json` (and per step to
    `timings/<stage>_steps.csv`), outside every DVC output. What it ran on is what a
    bit-identical replay needs again (`rlhf verify`).

    A rerun with the same params and seed reproduces every output byte for byte except its
    speed: were timings in the metrics files, each identical rerun would change their hashes
    in dvc.lock and lead `dvc metrics diff` with throughput "changes".
    """
    import torch  # the stages that time themselves have it loaded

    from rlhf.cpu import cpu_signature
    from rlhf.stages.support.common import params

    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    signature = cpu_signature(params().cpu_kernels)
    machine = {"threads": torch.get_num_threads(), "processes": world, "cpu": signature}
    write_json(paths.timings_file(stage), machine | summary)
    if steps:
        write_csv(paths.timing_steps_file(stage), steps)
