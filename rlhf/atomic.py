"""Write-then-rename, so a crashed or interrupted command never leaves a half-written output.

`os.replace` is atomic on POSIX when source and target share a file system, which is why every
temporary path sits beside its target rather than in /tmp. Two levels:

- `atomic_path`: one file, written to a temporary beside it and renamed over it. It never
  replaces a folder: a folder given as a target may hold what a user cares about.
- `publication`: every output of a stage, staged beside its target and moved into place
  together once all are written, so a failure leaves the previous outputs as they were rather
  than a new model beside old metrics. Declared outputs may be folders; the previous version
  is moved aside and deleted only once every new output is in place.

A killed process can leave temporaries (`.NAME.*.tmp`) behind; `remove_stale` clears them when
the same command starts again.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rlhf.errors import OutputError

TEMP_SUFFIX = ".tmp"


def _temp_dir(target: Path) -> Path:
    """A fresh folder beside `target`, named after it so `remove_stale` can find it."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return Path(
            tempfile.mkdtemp(prefix=f".{target.name}.", suffix=TEMP_SUFFIX, dir=target.parent)
        )
    except OSError as exc:
        raise OutputError(f"{target}: cannot write there ({exc.strerror})") from exc


def _refuse_folder(target: Path) -> None:
    if target.is_dir() and not target.is_symlink():
        raise OutputError(
            f"{target} is a folder; refusing to replace it with a file (name a file path, "
            "or a folder to write into)"
        )


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `target`; on success move it over `target`.

    The caller may create a file or a folder at the yielded path. A `target` that is an
    existing folder is refused, never replaced. On an exception the temporary is removed and
    the target is untouched.
    """
    target = Path(target)
    _refuse_folder(target)
    tmp = _temp_dir(target)
    staged = tmp / target.name
    try:
        yield staged
        _refuse_folder(target)  # a folder made there meanwhile is not ours either
        os.replace(staged, target)
    except OSError as exc:  # a full disk, a file-size limit, a file system gone read-only
        free = shutil.disk_usage(target.parent).free / 2**20
        raise OutputError(
            f"{target}: could not write it ({exc.strerror or exc}); {free:.0f} MiB free on its disk"
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class Publication:
    """Outputs staged beside their targets, to be moved into place all together.

    `publication[target]` is the path to write `target`'s new version to (a file or a folder).
    """

    def __init__(self) -> None:
        self._staged: dict[Path, Path] = {}  # target -> its temporary folder

    def __getitem__(self, target: str | Path) -> Path:
        target = Path(target)
        if target not in self._staged:
            self._staged[target] = _temp_dir(target)
        return self._staged[target] / target.name

    def target_of(self, text: str) -> str:
        """`text` with every staged path in it named as the target it stands for."""
        for target, tmp in self._staged.items():
            text = text.replace(str(tmp / target.name), str(target))
        return text

    @property
    def targets(self) -> set[Path]:
        return set(self._staged)

    def commit(self) -> None:
        """Move every staged output over its target; if one move fails, move back those
        already made, so the targets end as all new or all previous."""
        done: list[Path] = []
        try:
            for target, tmp in self._staged.items():
                staged, previous = tmp / target.name, tmp / f"{target.name}.previous"
                if not staged.exists():
                    raise OutputError(f"{target}: nothing was written to publish")
                if target.exists() or target.is_symlink():
                    os.replace(target, previous)
                done.append(target)
                os.replace(staged, target)
        except BaseException:
            for target in reversed(done):
                tmp = self._staged[target]
                if target.exists() and not (tmp / target.name).exists():
                    os.replace(target, tmp / target.name)
                if (tmp / f"{target.name}.previous").exists():
                    os.replace(tmp / f"{target.name}.previous", target)
            raise

    def discard(self) -> None:
        """Remove the temporaries: staged outputs never moved, previous versions replaced."""
        for tmp in self._staged.values():
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def publication() -> Iterator[Publication]:
    """Stage outputs inside the block; they replace their targets together when it ends
    without an exception, and not at all otherwise."""
    staged = Publication()
    try:
        yield staged
        staged.commit()
    except OutputError as exc:  # name the output the user knows, not its temporary
        raise OutputError(staged.target_of(str(exc))) from exc
    finally:
        staged.discard()


def remove_stale(targets: Iterable[str | Path]) -> None:
    """Delete temporaries a killed run left beside these targets."""
    for target in map(Path, targets):
        if target.parent.is_dir():
            for stale in target.parent.glob(f".{target.name}.*{TEMP_SUFFIX}"):
                shutil.rmtree(stale, ignore_errors=True)


def remove_stale_in(folder: str | Path) -> None:
    """Delete every temporary a killed run left in `folder`, whatever its target."""
    for stale in Path(folder).glob(f".*{TEMP_SUFFIX}"):
        shutil.rmtree(stale, ignore_errors=True)


def write_text(target: str | Path, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def write_json(target: str | Path, payload: Any) -> None:
    write_text(target, json.dumps(unsigned_zeros(payload), indent=2, sort_keys=True) + "\n")


def unsigned_zeros(payload: Any) -> Any:
    """`payload` with every -0.0 as 0.0: a KL rounded to 4 decimals from -1e-9 is zero, and
    `dvc metrics show` would print it as `-0.0`."""
    if isinstance(payload, dict):
        return {key: unsigned_zeros(value) for key, value in payload.items()}
    if isinstance(payload, list | tuple):
        return [unsigned_zeros(value) for value in payload]
    return payload + 0.0 if isinstance(payload, float) else payload  # -0.0 + 0.0 == +0.0


def write_csv(target: str | Path, rows: list[dict[str, Any]]) -> None:
    """Rows with the same keys as one CSV table (what `dvc plots` reads)."""
    with atomic_path(target) as tmp, tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
