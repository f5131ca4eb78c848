"""Exclusive file locks: one holder at a time of a repository, a stage, a labeler's labels.

An `flock` on a lock file, rather than a file whose existence means "taken": the kernel
releases it the moment its holder dies, however it dies, so a killed run never leaves a stale
lock, and it holds across containers that mount the same files. The lock file is never the
file it guards: outputs are replaced by renames, which a lock on them would not survive.
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO

from rlhf.errors import OutputError


def try_lock(file: Path) -> IO[str] | None:
    """The open lock file, held exclusively until closed (or the process ends); None if
    another process holds it. An OutputError if the lock file cannot be made."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        handle = file.open("a")
    except OSError as exc:
        raise OutputError(f"{file}: cannot create the lock file ({exc.strerror or exc})") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    except OSError as exc:  # a file system without locks (some NFS, CIFS and FUSE mounts)
        handle.close()
        raise OutputError(
            f"{file}: cannot be locked ({exc.strerror or exc}); keep the project on a file "
            "system with file locks"
        ) from None
    return handle
