"""`python -m MODULE ARGS` as a fork of a process that imported MODULE already.

A stage or CLI process spends 3 s or more of CPU here importing torch before it reads its
first input, and the malformed-input corpus runs dozens of commands that stop at their first
input, most of the corpus's time. Each run here is still a process of its own, with its own
working directory, environment, exit status and output, and a time limit,
but it forks from a server process (multiprocessing's forkserver) that imported the entry
points once and ran no tensor operation: the stage then pins its CPU kernels and threads as
a fresh `python -m` does (`tests/unit/test_cpu_kernels.py` holds that importing a stage runs
none). What differs from `python -m` is only the import, which no input can affect.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

_FORKSERVER = multiprocessing.get_context("forkserver")


def preload(modules: Iterable[str]) -> None:
    """The modules the forkserver imports before its first fork (it starts at the first run).
    Set before that run: a server already started keeps what it imported."""
    _FORKSERVER.set_forkserver_preload(sorted(set(modules)))


def _run(argv: list[str], cwd: str, env: dict[str, str], log: str) -> None:
    """In the forked process: become `python -m argv[2] argv[3:]` run in `cwd` under `env`,
    its output to `log`; multiprocessing turns SystemExit into the exit status and prints an
    uncaught exception's traceback, as the interpreter does."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    output = os.open(log, os.O_WRONLY | os.O_APPEND)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
        os.dup2(output, stream.fileno())
    sys.path[0] = cwd  # as `python -m` puts the working directory first
    module, sys.argv = argv[2], [argv[0], *argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    """`argv` (`[sys.executable, "-m", module, *args]`) forked: its exit status (128 + the
    signal for a killed one, as a shell reports it) and its stdout and stderr, interleaved.
    Its output goes to a file, so a file-size limit (RLIMIT_FSIZE) would cap that too: a
    command under one runs as a plain subprocess."""
    if argv[1:2] != ["-m"]:
        raise ValueError(f"not a `python -m` command: {argv}")
    with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
        process = _FORKSERVER.Process(target=_run, args=(argv, str(cwd), env, log.name))
        process.start()
        process.join(timeout_s)
        if process.exitcode is None:
            process.kill()
            process.join()
        status = process.exitcode if process.exitcode >= 0 else 128 - process.exitcode
        return status, log.read()
