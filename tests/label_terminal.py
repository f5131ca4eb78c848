"""`rlhf label` driven as a person drives it: through a pseudo-terminal (pexpect)."""

from __future__ import annotations

import sys
from pathlib import Path

import pexpect

from conftest import clean_env

PROMPT = "rank> "


def start_labeling(
    project: Path, labeler: str, dimensions: tuple[int, int] = (40, 100)
) -> pexpect.spawn:
    """`rlhf label --labeler NAME` in `project`, on a terminal of (rows, columns)."""
    return pexpect.spawn(
        sys.executable, ["-m", "rlhf.cli", "label", "--labeler", labeler],
        cwd=project, env=clean_env() | {"TERM": "xterm"}, encoding="utf-8",
        dimensions=dimensions, timeout=60,
    )  # fmt: skip


def answer(session: pexpect.spawn, typed: str, then: str) -> None:
    """Type `typed` at the prompt, then wait for `then` and the next prompt."""
    session.sendline(typed)
    session.expect_exact(then)
    session.expect_exact(PROMPT)
