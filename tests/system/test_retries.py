"""Retries that resume: a training stage killed mid-run under `rlhf run` is retried by the
flow's task and picks up from its last save, ending with the outputs of an uninterrupted run,
byte for byte. The failure is a real one, the stage's process SIGKILLed as an OOM killer or a
preempted host would, not a mock."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil  # DVC's own dependency
import pytest

# GPU hosts run the suite without Prefect (benchmarks/gpu.sh): skipped there
pytest.importorskip("prefect")

from prefect import get_client
from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName
from prefect.client.schemas.objects import TaskRun

from rlhf.dvcfile import declared_stages
from rlhf.models import checkpoint

from conftest import init_dvc_repo, make_project, prefect_env

SFT = declared_stages()["sft"]
# not the default of 1, so that the task's retry policy shows the option reached it: a
# `rlhf run` that dropped it would still retry once
RETRIES = 2
# DVC's line for the killed stage: it runs the command through $SHELL (else /bin/sh); bash
# execs a lone command, so DVC sees the signal (-9), while dash waits for it and exits 128 + 9
SIGKILLED = rf"python -m {re.escape(SFT.module)}, exited with (-9|137)\b"


def output_bytes(project: Path) -> dict[str, bytes]:
    """Every file among sft's declared outputs (model, metrics, details, curves) -> its bytes."""
    files = {}
    for output in SFT.outputs:
        path = project / output
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if file.is_file():
                files[str(file.relative_to(project))] = file.read_bytes()
    return files


def kill_stage_at_first_save(run: subprocess.Popen, project: Path) -> int:
    """SIGKILL the sft process that `run` started (through `dvc repro`) as soon as it has
    written its resume state; the step that state holds."""
    resume = project / SFT.resume_file
    deadline = time.monotonic() + 300
    while not resume.exists():
        assert run.poll() is None, "rlhf run ended before sft saved its resume state"
        assert time.monotonic() < deadline, "sft saved no resume state within 300 s"
        time.sleep(0.005)
    stage = stage_process(run)
    stage.kill()
    stage.wait()
    return checkpoint.load(resume)["step"]


def stage_process(run: subprocess.Popen) -> psutil.Process:
    """The `python -m rlhf.stages.sft` among what `run` started; one that ends while they
    are listed is not it."""
    for process in psutil.Process(run.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.cmdline()[-2:] == ["-m", SFT.module]:
                return process
    raise AssertionError(f"rlhf run started no {SFT.module} process")


def stop(run: subprocess.Popen) -> None:
    """End `run` and what it started, if a failed assertion left it running."""
    if run.poll() is None:
        for process in [*psutil.Process(run.pid).children(recursive=True), run]:
            process.kill()
        run.wait()


def sft_task_run() -> TaskRun:
    """The flow's sft task run, read back from the Prefect server.

    Its log lines are read from `rlhf run`'s console instead, where a user reads them: the
    test server's SQLite may drop a batch of log records under load ("database is locked")."""
    with get_client(sync_client=True) as client:
        (task_run,) = client.read_task_runs(
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=[SFT.name]))
        )
    return task_run


@pytest.mark.slow
def test_a_killed_training_stage_is_retried_and_resumes_to_the_uninterrupted_bytes(
    trained_project, tmp_path, prefect_server
):
    """`rlhf run --target sft` in a fresh project: the sft process is killed just after its
    first save; the flow's task retries it, the retry resumes from that save (not from
    scratch), and the stage's outputs are those the trained project's uninterrupted `dvc
    repro` wrote from the same params."""
    project = init_dvc_repo(make_project(tmp_path / "project"))
    log = tmp_path / "rlhf-run.log"
    with log.open("w") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "rlhf.cli", "run", "--target", "sft", "--retries", str(RETRIES)],
            cwd=project, env=prefect_env(prefect_server), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        killed_at = kill_stage_at_first_save(run, project)
        assert run.wait(timeout=600) == 0, log.read_text()[-4000:]
    finally:
        stop(run)

    task_run, task_log = sft_task_run(), log.read_text()
    assert (task_run.state.name, task_run.run_count) == ("Completed", 2)
    assert task_run.empirical_policy.retries == RETRIES
    assert re.search(SIGKILLED, task_log), task_log[-4000:]
    # a retry from scratch ends with the same bytes (training is deterministic): only this
    # line tells that it resumed
    assert f"sft: resuming from step {killed_at} of " in task_log
    assert output_bytes(project) == output_bytes(trained_project)
    assert not (project / SFT.resume_file).exists() and not (project / SFT.live_folder).exists()
