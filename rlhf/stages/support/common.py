"""What every stage does the same way: params, console output, progress bars, digests."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from rlhf.params import Params, load_params
from rlhf.project import paths

# a log line stays one line however long, on a terminal or off it (where rich would otherwise
# wrap at 80 columns, splitting one message over several lines of a CI or Prefect log)
console = Console(stderr=True, soft_wrap=True)


def params(path: Path = paths.PARAMS) -> Params:
    return load_params(path)


PROGRESS_LINE_EVERY_S = 30.0  # off a terminal: a progress line this often


class ProgressLines(Progress):
    """Progress for logs. Off a terminal (CI, nohup, Prefect's logs) a redrawn bar shows
    nothing until it ends, so a long stage looks hung; this prints each task's state as a line
    every `every` seconds instead, and once more when the work ends."""

    def __init__(self, *columns: Any, every: float, **kwargs: Any) -> None:
        super().__init__(*columns, disable=True, **kwargs)
        self.every = every
        self.last_line = time.monotonic()

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        if time.monotonic() - self.last_line >= self.every:
            self.print_lines()

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def stop(self) -> None:
        self.print_lines()
        super().stop()

    def print_lines(self) -> None:
        self.last_line = time.monotonic()
        for task in self.tasks:
            done = f"{task.completed:g}" + (f"/{task.total:g}" if task.total else "")
            elapsed = time.strftime("%H:%M:%S", time.gmtime(task.elapsed or 0))
            extra = task.fields.get("extra", "")
            self.console.print(Text(f"{task.description}: {done} {extra} {elapsed}"))


def progress(quiet: bool = False) -> Progress:
    """A progress bar for long loops, or lines in a log (`ProgressLines`); `extra` fields
    show live values such as the loss. `quiet`: one that shows nothing (a data-parallel
    worker other than rank 0)."""
    if quiet:
        return Progress(disable=True)
    if not console.is_terminal:
        return ProgressLines(console=console, every=PROGRESS_LINE_EVERY_S)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[extra]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def file_digest(*entries: Path) -> str:
    """sha256 over the named files and, for folders, every file beneath them: each file's
    path as named and its bytes, for resume fingerprints."""
    digest = hashlib.sha256()
    for entry in entries:
        files = sorted(p for p in entry.rglob("*") if p.is_file()) if entry.is_dir() else [entry]
        for file in files:
            digest.update(str(file).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]
