"""Running a training stage as N data-parallel processes, through torchrun's own launcher.

How many processes is a property of the host, not of the experiment, so it is read from the
environment (`RLHF_NPROC`: a number, or `auto` for every visible GPU) and never from
params.yaml: the DVC stage's command, params and fingerprint are the same at any N, and a
resume state written at one N resumes at another. `python -m rlhf.stages.sft` (what dvc.yaml
runs) starts torch's elastic agent, the engine behind `torchrun --standalone`, which runs the
same command as N workers; when one dies the agent stops the others at once and this process
exits with one line naming the rank and how it ended.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Callable

from rlhf.errors import PipelineError
from rlhf.stages.entry import USER_ERROR

NPROC_ENV = "RLHF_NPROC"
MONITOR_INTERVAL_S = 0.5  # how often the agent checks its workers


def processes_requested() -> int:
    """The process count `RLHF_NPROC` asks for (1 when unset)."""
    value = os.environ.get(NPROC_ENV, "1").strip().lower()
    if value == "auto":
        import torch

        return max(1, torch.cuda.device_count())
    if not value.isdigit() or int(value) < 1:
        raise PipelineError(
            f"{NPROC_ENV}={value!r}: give a number of processes (1, 2, ...) or auto"
        )
    return int(value)


def is_worker() -> bool:
    """Whether torchrun (or this launcher) started this process as one of its workers."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ


def run_stage(run: Callable[[], object], module: str, args: list[str]) -> None:
    """A data-parallel stage: `run` in this process, or `python -m module args` as the
    workers `RLHF_NPROC` asks for."""
    nproc = 1 if is_worker() else processes_requested()
    if nproc == 1:
        run()
    else:
        run_workers(module, args, nproc)


def run_workers(module: str, args: list[str], nproc: int) -> None:
    """Run `python -m module args` as `nproc` workers on this host and wait for them. A worker
    that stopped on an error it explained (its `error:` line) ends this process with the same
    status; any other failure raises `WorkerFailed` naming the first rank that failed."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # said below
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port, as `torchrun --standalone` picks
        max_restarts=0,  # a failed stage is rerun by `dvc repro`, which resumes it
        monitor_interval=MONITOR_INTERVAL_S,
    )
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", module, *args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode == USER_ERROR:
            raise SystemExit(USER_ERROR) from None
        raise WorkerFailed(rank, nproc, failure.exitcode, failure.signal_name()) from None


class WorkerFailed(PipelineError):
    """A worker of a data-parallel stage exited with an error or was killed."""

    def __init__(self, rank: int, nproc: int, exitcode: int, signal: str) -> None:
        how = f"was killed by {signal}" if exitcode < 0 else f"exited with status {exitcode}"
        super().__init__(
            f"rank {rank} of {nproc} {how}, and the other ranks were stopped; run the stage "
            "again (dvc repro) to resume from its last save (RLHF_DEBUG=1 shows each rank's "
            "traceback)"
        )
