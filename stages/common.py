"""What every stage does the same way: params, console output, input fingerprints."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from rlhf import checkpoint
from rlhf.atomic import write_csv, write_json
from rlhf.params import Params, load_params
from rlhf.trainer import History
from stages import paths

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


def file_digest(*files: Path) -> str:
    """sha256 over the named files' bytes, for resume fingerprints."""
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def publish_training(
    *,
    model_file: Path,
    payload: dict[str, Any],
    history: History,
    steps_file: Path,
    epochs_file: Path,
    metrics_file: Path,
    metrics: dict[str, Any],
    resume_file: Path,
) -> None:
    """Write a finished training stage's outputs, each atomically, and only then drop its resume
    state: a crash in between resumes and rewrites rather than retraining from scratch."""
    checkpoint.save(model_file, payload)
    write_csv(steps_file, history.steps)
    write_csv(epochs_file, history.epochs)
    write_json(metrics_file, metrics)
    resume_file.unlink(missing_ok=True)
