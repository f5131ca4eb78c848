"""Write-then-rename, so a crashed or interrupted stage never leaves a half-written output.

`os.replace` is atomic on POSIX when source and target share a file system, which is why the
temporary path sits beside the target rather than in /tmp.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `target`; on success move it over `target`.

    Works for files and directories: whatever the caller creates at the yielded path replaces
    the target whole. On an exception the temporary is removed and the target is untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    staged = tmp / target.name
    try:
        yield staged
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(staged, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(target: str | Path, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def write_json(target: str | Path, payload: Any) -> None:
    write_text(target, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def write_csv(target: str | Path, rows: list[dict[str, Any]]) -> None:
    """Rows with the same keys as one CSV table (what `dvc plots` reads)."""
    with atomic_path(target) as tmp, tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
