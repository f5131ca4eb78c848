"""What every stage does the same way: params, console output, progress bars, digests."""

from __future__ import annotations

import hashlib
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from rlhf.params import Params, load_params
from rlhf.stages import paths

console = Console(stderr=True)


def params(path: Path = paths.PARAMS) -> Params:
    return load_params(path)


def progress() -> Progress:
    """A progress bar for long loops; `extra` fields show live values such as the loss."""
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
