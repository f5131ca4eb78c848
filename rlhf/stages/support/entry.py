"""How every entry point ends a failed run: one line saying what is wrong, exit status 2.

`python -m rlhf.stages.X` (what `dvc repro` runs), the `rlhf` command and the Prefect tasks
all report through here. A failure the user can fix (a `PipelineError`, a file the OS refused,
memory the device lacks) prints `error: <message>` on one line and no traceback; anything
else is a bug and keeps its traceback. RLHF_DEBUG=1 (or `rlhf --debug`) keeps every traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn

from rich.text import Text

from rlhf.errors import (
    INTERRUPTED,
    PEER_LOST,
    RETRY,
    USER_ERROR,
    PipelineError,
    StageInterrupted,
)
from rlhf.stages.support import launch
from rlhf.stages.support.common import console
from rlhf.stages.support.outputs import release_stages

DEBUG_ENV = "RLHF_DEBUG"
ERROR_PREFIX = "error: "  # what the Prefect task looks for in a stage's output: do not retry
FAILED_PREFIX = "failed: "  # a failure a rerun resumes from: the task retries
# where a failure inside a collective surfaces: torch.distributed, DDP's wrapper and reducer
COLLECTIVE_CODE = (f"torch{os.sep}distributed{os.sep}", f"torch{os.sep}nn{os.sep}parallel{os.sep}")


def debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def describe(exc: BaseException) -> str | None:
    """The one line for a failure the user can act on; None for a bug."""
    if isinstance(exc, PipelineError):
        return str(exc)
    torch = sys.modules.get("torch")  # not imported: the failure cannot be torch's
    if torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError):
        first = str(exc).splitlines()[0] if str(exc) else "CUDA out of memory"
        return f"{first}; lower the batch sizes in params.yaml"
    if isinstance(exc, MemoryError):
        return "out of memory; use a smaller model or smaller batches in params.yaml"
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return None


def print_error(message: str, prefix: str = ERROR_PREFIX) -> None:
    """`error: message` on one line, however long (no wrapping at the terminal's width); a
    data-parallel worker other than rank 0 names its rank."""
    rank = os.environ.get("RANK", "0")
    message = message if rank == "0" else f"rank {rank}: {message}"
    console.print(Text(prefix, style="bold red") + Text(" ".join(message.split())))


def lost_peer(exc: BaseException) -> bool:
    """Whether a data-parallel worker failed inside torch.distributed: a collective broken by
    a rank that died, which the launcher reports in one line naming that rank."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return False
    if any(backend in str(exc) for backend in ("gloo", "NCCL", "ProcessGroup")):
        return True
    tb = exc.__traceback__
    while tb is not None:
        if any(part in tb.tb_frame.f_code.co_filename for part in COLLECTIVE_CODE):
            return True
        tb = tb.tb_next
    return False


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (`kill`, `docker stop`, a scheduler cancelling) ends the run as Ctrl-C does:
    the error line, and the resume state kept for the next run, rather than a silent exit
    143. Only the main thread can take signals; elsewhere, and in a data-parallel worker
    (which its launcher stops with SIGTERM when another fails), the default stays."""
    if threading.current_thread() is not threading.main_thread() or launch.is_worker():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


def report_errors(run: Callable[[], object]) -> int:
    """Run, and return the exit status: 0, USER_ERROR after printing the error line, RETRY
    after a `failed:` line (`StageInterrupted`), or INTERRUPTED. Bugs propagate with their
    traceback; a worker that lost a peer exits with PEER_LOST and says nothing
    (`lost_peer`)."""
    try:
        with sigterm_interrupts():
            run()
    except KeyboardInterrupt:
        if debug_requested():
            raise
        print_error("interrupted; run the command again to resume where it stopped")
        return INTERRUPTED
    except StageInterrupted as exc:
        print_error(str(exc), FAILED_PREFIX)
        return RETRY
    except Exception as exc:
        if lost_peer(exc) and not debug_requested():
            return PEER_LOST
        message = describe(exc)
        if message is None or debug_requested():
            raise
        print_error(message)
        return USER_ERROR
    finally:
        release_stages()
    return 0


def main(run: Callable[[], object], *, data_parallel: bool = False) -> None:
    """What a stage module runs as `python -m`: the stage, then its exit status. A
    `data_parallel` stage asked for more than one process (`RLHF_NPROC`) runs as that many
    torchrun workers of this same command instead (`rlhf.stages.support.launch`)."""
    if data_parallel:
        spec = sys.modules["__main__"].__spec__  # None when run as a file, not with -m
        module = spec.name if spec else None
        sys.exit(report_errors(lambda: launch.run_stage(run, module, sys.argv[1:])))
    sys.exit(report_errors(run))
