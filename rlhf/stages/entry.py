"""How every entry point ends a failed run: one line saying what is wrong, exit status 2.

`python -m rlhf.stages.X` (what `dvc repro` runs), the `rlhf` command and the Prefect tasks
all report through here. A failure the user can fix (a `PipelineError`, a file the OS refused,
memory the device lacks) prints `error: <message>` on one line and no traceback; anything
else is a bug and keeps its traceback. RLHF_DEBUG=1 (or `rlhf --debug`) keeps every traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from rich.text import Text

from rlhf.errors import PipelineError
from rlhf.stages.common import console

DEBUG_ENV = "RLHF_DEBUG"
USER_ERROR = 2  # exit status of a failure the message explains
INTERRUPTED = 130  # 128 + SIGINT, as shells report it
ERROR_PREFIX = "error: "  # what the Prefect task looks for in a stage's output


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


def print_error(message: str) -> None:
    """`error: message` on one line, however long (no wrapping at the terminal's width)."""
    console.print(Text(ERROR_PREFIX, style="bold red") + Text(" ".join(message.split())),
                  soft_wrap=True)  # fmt: skip


def report_errors(run: Callable[[], object]) -> int:
    """Run, and return the exit status: 0, USER_ERROR after printing the error line, or
    INTERRUPTED. Bugs propagate with their traceback."""
    try:
        run()
    except KeyboardInterrupt:
        if debug_requested():
            raise
        print_error("interrupted; run the command again to resume where it stopped")
        return INTERRUPTED
    except Exception as exc:
        message = describe(exc)
        if message is None or debug_requested():
            raise
        print_error(message)
        return USER_ERROR
    return 0


def main(run: Callable[[], object]) -> None:
    """What a stage module runs as `python -m`: the stage, then its exit status."""
    sys.exit(report_errors(run))
