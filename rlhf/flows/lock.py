"""One pipeline run per repository at a time, across every way a run starts.

Two runs in one repository would collide on DVC's lock (the second fails mid-way) or, worse,
on the checkpoints in the shared cache. The nightly schedule, a manual `prefect deployment
run` and `rlhf run` all start the same flow, so the flow itself takes an exclusive `flock` on
`.rlhf/pipeline.lock` before it touches anything; a second run logs that it waits, and waits.

A file lock rather than a Prefect concurrency limit: the kernel releases it the moment its
holder dies, however it dies (a limit's lease lives on the Prefect server, which may have
restarted or be a temporary one), and it holds across containers that mount the repository,
since they share the host's kernel and the file's inode.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prefect import get_run_logger

from rlhf.errors import PipelineError
from rlhf.locks import try_lock

LOCK_FILE = Path(".rlhf") / "pipeline.lock"
HOLDING, RELEASED = "holding", "released"  # the log lines that bracket a run's hold
POLL_S = 1.0


class RepositoryBusy(PipelineError):
    """Another pipeline run held the repository for longer than this run would wait."""


@contextmanager
def one_run_per_repository(root: Path, timeout_s: float | None) -> Iterator[None]:
    """Hold the repository for the duration; waits up to `timeout_s` (None: as long as the
    run before takes) and raises RepositoryBusy after."""
    logger = get_run_logger()
    file = root / LOCK_FILE
    waited = time.monotonic()
    logged = False
    while (handle := try_lock(file)) is None:
        if not logged:
            logger.info("%s: another pipeline run holds this repository; waiting", root)
            logged = True
        if timeout_s is not None and time.monotonic() - waited > timeout_s:
            raise RepositoryBusy(f"another pipeline run held {root} for more than {timeout_s:g} s")
        time.sleep(POLL_S)
    with handle:
        logger.info("%s: %s %s", root, HOLDING, file)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            logger.info("%s: %s %s", root, RELEASED, file)
