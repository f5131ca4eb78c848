"""One pipeline run per repository at a time, across every way a run starts.

Two runs in one repository would collide on DVC's lock (the second fails mid-way) or, worse,
on the checkpoints in the shared cache. The nightly schedule, a manual `prefect deployment
run` and `rlhf run` all start the same flow, so the flow itself takes a Prefect global
concurrency slot named after the repository before it touches anything; a second run waits
for the first (its log says so) instead of failing. The slot is leased, so a run killed
outright frees it when its lease lapses.

The repository is named by an id kept in `.rlhf/`, not by its path: a repository mounted at
/workspace in a container and seen at its host path by `rlhf run` is one repository.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prefect import get_client, get_run_logger
from prefect.concurrency.sync import concurrency

ID_FILE = Path(".rlhf") / "repository-id"
HOLDING, RELEASED = "holding", "released"  # the log lines that bracket a run's hold


def repository_id(root: Path) -> str:
    """This repository's id, created on first use (`.rlhf/` is git-ignored: each clone is
    its own repository)."""
    file = root / ID_FILE
    if not file.exists():
        file.parent.mkdir(parents=True, exist_ok=True)
        staged = file.with_suffix(f".{uuid.uuid4().hex}.tmp")
        staged.write_text(uuid.uuid4().hex[:12])
        staged.replace(file)  # two first runs at once agree on whichever rename came last
    return file.read_text().strip()


def limit_name(root: Path) -> str:
    return f"rlhf-repository-{repository_id(root)}"


@contextmanager
def one_run_per_repository(root: Path, timeout_s: float | None) -> Iterator[None]:
    """Hold the repository's slot for the duration; waits up to `timeout_s` (None: as long
    as the run before takes) and raises TimeoutError after."""
    logger = get_run_logger()
    name = limit_name(root)
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, limit=1)
        if client.read_global_concurrency_limit_by_name(name).active_slots:
            logger.info("%s: another pipeline run holds this repository; waiting for it", root)
    with concurrency(name, occupy=1, timeout_seconds=timeout_s, strict=True):
        logger.info("%s: %s %s", root, HOLDING, name)
        try:
            yield
        finally:
            logger.info("%s: %s %s", root, RELEASED, name)
