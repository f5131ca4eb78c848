"""`rlhf verify`, the replay certificate, on the tiny project: identical on a clean replay, the
output named after a deliberate one-byte change to a recorded output, the workspace untouched."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env, sh

pytestmark = pytest.mark.slow


def verify(project: Path, *stages: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlhf.cli", "verify", *stages],
        cwd=project, env=clean_env(), capture_output=True, text=True,
    )  # fmt: skip


def file_hashes(project: Path) -> dict[str, str]:
    """Every file of the workspace but DVC's and git's own bookkeeping, by its md5."""
    return {
        str(path.relative_to(project)): hashlib.md5(path.read_bytes()).hexdigest()
        for path in sorted(project.rglob("*"))
        if path.is_file() and not {".git", ".dvc"} & set(path.relative_to(project).parts)
    }


def test_verify_replays_recorded_stages_and_names_an_output_that_differs(trained_project, tmp_path):
    project = tmp_path / "p"
    shutil.copytree(trained_project, project, ignore=shutil.ignore_patterns("__pycache__"))
    before = file_hashes(project)
    cached = sorted((project / ".dvc" / "cache").rglob("*"))

    clean = verify(project, "prepare", "rm")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "a replay is bit-identical only where the recording run's CPU" in clean.stderr
    assert "this machine is the recording one's (timings/" in clean.stderr  # a run of its own
    lines = clean.stdout.splitlines()
    assert "prepare: identical  data/prepared/sft_train.parquet" in lines
    assert "rm: identical  artifacts/rm/model.pt" in lines
    assert "rm: identical  metrics/rm.json" in lines
    assert all(": identical  " in line for line in lines)
    assert "verify: all " in clean.stderr and " outputs of 2 stages identical" in clean.stderr
    assert file_hashes(project) == before  # the user's outputs untouched
    assert sorted((project / ".dvc" / "cache").rglob("*")) == cached  # and the cache

    # one byte of a recorded output changed and recorded, as a result the code did not make
    metrics = project / "metrics" / "rm.json"
    recorded = json.loads(metrics.read_text())
    text = metrics.read_text()
    digit = text.index(str(recorded["acc"])) + len(str(recorded["acc"])) - 1
    changed = text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1 :]
    metrics.write_text(changed)
    sh(["dvc", "commit", "--force", "rm"], project)

    differs = verify(project, "rm")
    assert differs.returncode == 1
    (line,) = [line for line in differs.stdout.splitlines() if "DIFFERS" in line]
    assert line.startswith("rm: DIFFERS    metrics/rm.json (recorded ")
    assert line.endswith("; first differing keys: acc")
    assert "not identical to dvc.lock's record: rm" in differs.stderr
    assert metrics.read_text() == changed

    # inputs that are not the recorded ones: named, not replayed
    params = project / "params.yaml"
    params.write_text(params.read_text().replace("lr: 0.002", "lr: 0.003"))
    stale = verify(project, "rm")
    assert stale.returncode == 1
    assert stale.stdout.splitlines() == [
        "rm: NOT REPLAYED: its inputs are not the recorded ones: params.yaml changed"
    ]

    unknown = verify(project, "rl@nope")
    assert unknown.returncode == 2 and "dvc.lock records no stage rl@nope; it records prepare" in (
        unknown.stderr
    )
    assert "Traceback" not in unknown.stderr
