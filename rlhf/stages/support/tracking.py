"""Experiment tracking besides dvclive: where a finished stage's run is logged.

With `tracking.mlflow` (or RLHF_MLFLOW_TRACKING_URI) naming an MLflow tracking server, each stage
that runs logs its params, headline metrics, curves and the report to an MLflow run of its own
(`mlflow_runs.py`), a child of one parent run per pipeline run. Unset, nothing here imports
MLflow and nothing changes. Tracking writes nothing the pipeline reads: no stage depends on
the `tracking` group, and outputs are the same with it or without.

Which pipeline run a stage belongs to: RLHF_PIPELINE_RUN where the caller set it (the Prefect
flows set their flow run's id), else the `dvc repro` (or `dvc exp run`) process the stage runs
under, which runs every stage of one pipeline run; a stage started by hand is its own.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from rlhf.params import Params, load_params
from rlhf.project import paths
from rlhf.project.specs import StageSpec
from rlhf.stages.support.common import console

URI_ENV = "RLHF_MLFLOW_TRACKING_URI"
PIPELINE_RUN_ENV = "RLHF_PIPELINE_RUN"
PROC = Path("/proc")


def tracking_uri(params: Params) -> str:
    """The MLflow tracking URI in effect: the environment's, else the param; empty: off."""
    return os.environ.get(URI_ENV) or params.tracking.mlflow


def process_line(pid: int) -> tuple[list[str], int, str] | None:
    """A process's arguments, its parent's pid and its start time (clock ticks since boot),
    from /proc; None where it is gone or there is no /proc."""
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command, which may hold spaces
    return [a.decode(errors="replace") for a in argv if a], int(fields[1]), fields[19]


def pipeline_run() -> str:
    """What names this stage's pipeline run: RLHF_PIPELINE_RUN, else the nearest `dvc`
    ancestor process (host, pid and start time: unique while the machine runs), else this
    process."""
    if os.environ.get(PIPELINE_RUN_ENV):
        return os.environ[PIPELINE_RUN_ENV]
    pid = os.getpid()
    while pid > 1 and (line := process_line(pid)) is not None:
        argv, parent, started = line
        if any(Path(arg).name == "dvc" for arg in argv[:2]):
            return f"{socket.gethostname()}-{pid}-{started}"
        pid = parent
    return f"{socket.gethostname()}-{os.getpid()}"


def track(spec: StageSpec) -> None:
    """Log the stage's finished run to MLflow when tracking is on. Its outputs are published
    by then: a server that cannot be reached costs a warning, never the run."""
    params = load_params(paths.PARAMS)
    uri = tracking_uri(params)
    if not uri:
        return
    try:
        from rlhf.stages.support.mlflow_runs import log_stage  # MLflow, only when asked for

        log_stage(uri, params.tracking.experiment, pipeline_run(), spec, params)
    except Exception as error:  # whatever the tracker raises, the run stands
        said = str(error).strip().splitlines()
        console.print(
            f"{spec.address}: warning: not logged to MLflow at {uri}: "
            f"{type(error).__name__}: {said[0] if said else ''}",
            markup=False,
        )
