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
import signal
import sys
import uuid
from collections.abc import Callable

from rlhf.errors import PEER_LOST, USER_ERROR, PipelineError, StageInterrupted

NPROC_ENV = "RLHF_NPROC"
MONITOR_INTERVAL_S = 0.5  # how often the agent checks its workers


def is_worker() -> bool:
    """Whether torchrun (or the stage launcher) started this process as one of its workers."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ


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


def run_stage(run: Callable[[], object], module: str | None, args: list[str]) -> None:
    """A data-parallel stage: `run` in this process (a worker leaves its process group at the
    end), or `python -m module args` as the workers `RLHF_NPROC` asks for."""
    if is_worker():
        try:
            run()
        finally:
            from rlhf.train.distributed import leave

            leave()
    elif (nproc := processes_requested()) == 1:
        run()
    elif module is None:
        raise PipelineError(f"{NPROC_ENV}={nproc}: run the stage as `python -m rlhf.stages.…`")
    else:
        run_workers(module, args, nproc)


def run_workers(module: str, args: list[str], nproc: int) -> None:
    """Run `python -m module args` as `nproc` workers on this host and wait for them.

    A worker that stopped on an error it explained (its `error:` line) ends this process
    with USER_ERROR; a worker killed or crashed raises `WorkerFailed` naming it (the others'
    broken collectives, PEER_LOST, are not causes); Ctrl-C is a KeyboardInterrupt as in one
    process, and so is SIGTERM (stopped from outside); another signal ends this process as
    that signal would."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed"):  # the agent's account: said below, in a line
            logging.getLogger(name).setLevel(logging.CRITICAL)
    # torchrun's default for CPU workers, which would otherwise each take every core
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
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
    except SignalException as exc:
        if exc.sigval in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C, or stopped from outside
            raise KeyboardInterrupt from None
        raise SystemExit(128 + exc.sigval) from None
    except ChildFailedError as exc:
        raise worker_failure(exc.failures, nproc) from None


def worker_failure(failures: dict, nproc: int) -> BaseException:
    """What ends the stage when workers failed ({rank: ProcessFailure}): the rank that failed
    first of its own accord, not one whose collective broke because of it nor one the agent
    stopped (SIGTERM) because of it."""
    if any(f.exitcode == USER_ERROR for f in failures.values()):
        return SystemExit(USER_ERROR)  # that worker printed why
    stopped = {rank: f for rank, f in failures.items() if f.exitcode == -signal.SIGTERM}
    causes = {
        rank: f for rank, f in failures.items() if f.exitcode != PEER_LOST and rank not in stopped
    } or stopped  # all stopped: the stage itself was (a SIGTERM from outside)
    if not causes:
        return WorkerFailed(
            f"a collective failed on all {nproc} ranks (the process group could not form or "
            "broke); RLHF_DEBUG=1 shows each rank's traceback"
        )
    rank = min(causes, key=lambda r: (causes[r].timestamp, r))
    failure = causes[rank]
    how = (
        f"was killed by {failure.signal_name()}"
        if failure.exitcode < 0
        else f"exited with status {failure.exitcode}"
    )
    return WorkerFailed(
        f"rank {rank} of {nproc} {how}, and the other ranks were stopped; run the stage again "
        "(dvc repro) to resume from its last save (RLHF_DEBUG=1 shows each rank's traceback)"
    )


class WorkerFailed(StageInterrupted):
    """A worker of a data-parallel stage was killed or crashed: a rerun resumes."""
