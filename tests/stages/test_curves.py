"""Training curves through dvclive, and the writer that stands in for it where DVC is absent."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf.project import paths
from rlhf.train.curves import METRICS_FOLDER, curve_log, read_curve
from rlhf.train.loop import curve_points

from conftest import clean_env, init_dvc_repo, make_project, sh

POINTS = [
    (1, {"train_loss": 2.5, "lr": 0.001, "update_epochs_run": 4}),
    (2, {"train_loss": 2.25, "lr": 0.002, "epoch/val_loss": 2.375, "epoch/train_loss": 2.375}),
    (3, {"train_loss": 1.0 / 3.0, "lr": 0.002}),
    (4, {"train_loss": 1e-7, "lr": 0.0015, "epoch/val_loss": 1.5, "epoch/train_loss": 0.5}),
]


def files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def logged(folder, use_dvclive):
    with curve_log(folder, use_dvclive=use_dvclive) as curves:
        for step, values in POINTS:
            curves.log(step, values)
    return folder / METRICS_FOLDER


def test_the_stand_in_writes_what_dvclive_writes_byte_for_byte(tmp_path):
    by_dvclive = logged(tmp_path / "dvclive", use_dvclive=True)
    by_stand_in = logged(tmp_path / "stand_in", use_dvclive=False)
    assert files(by_dvclive) == files(by_stand_in)
    assert (
        by_dvclive / "epoch" / "val_loss.tsv"
    ).read_text() == "step\tval_loss\n2\t2.375\n4\t1.5\n"
    assert read_curve(by_dvclive, "train_loss") == [(s, v["train_loss"]) for s, v in POINTS]
    assert read_curve(by_dvclive, "update_epochs_run") == [(1, 4)]


def test_dvclive_keeps_its_summary_beside_the_curves(tmp_path):
    logged(tmp_path / "live", use_dvclive=True)
    summary = json.loads((tmp_path / "live" / "metrics.json").read_text())
    assert summary["step"] == 4 and summary["train_loss"] == 1e-7
    assert summary["epoch"] == {"val_loss": 1.5, "train_loss": 0.5}


@pytest.mark.parametrize("use_dvclive", [True, False])
def test_a_fresh_log_drops_what_an_earlier_run_left(tmp_path, use_dvclive):
    folder = tmp_path / "live"
    logged(folder, use_dvclive)
    (folder / "leftover.txt").write_text("from a killed run")
    with curve_log(folder, use_dvclive=use_dvclive) as curves:
        curves.log(1, {"train_loss": 3.0})
    assert sorted(files(folder / METRICS_FOLDER)) == ["train_loss.tsv"]
    assert not (folder / "leftover.txt").exists()


def test_dvclive_runs_where_dvc_runs_the_stage_and_touches_neither_git_nor_dvc(tmp_path):
    """Outside a DVC run the stand-in writes (dvclive would look upwards for a repository, or
    `dvc init` one). Under DVC before the first commit dvclive cannot start (it reads HEAD):
    the stand-in again. After it, dvclive logs and leaves git and DVC as they were."""
    project = init_dvc_repo(make_project(tmp_path / "p"))
    live = project / ".rlhf" / "live" / "sft"
    code = (
        "from pathlib import Path\nfrom rlhf.train.curves import curve_log\n"
        "with curve_log(Path('.rlhf/live/sft')) as c:\n"
        "    c.log(1, {'train_loss': 1.5})\n"
    )
    under_dvc = clean_env() | {"DVC_ROOT": str(project)}
    for env in (clean_env(), under_dvc):
        subprocess.run([sys.executable, "-c", code], cwd=project, env=env, check=True)
        assert read_curve(live / METRICS_FOLDER, "train_loss") == [(1, 1.5)]
        assert not (live / "metrics.json").exists()  # written without dvclive
    sh(["git", "add", "-A"], project)
    sh(["git", "commit", "-qm", "project"], project)
    head = sh(["git", "rev-parse", "HEAD"], project)
    subprocess.run([sys.executable, "-c", code], cwd=project, env=under_dvc, check=True)
    assert json.loads((live / "metrics.json").read_text()) == {"train_loss": 1.5, "step": 1}
    assert sh(["git", "status", "--porcelain"], project) == ""  # dvc.yaml as it was, no adds
    assert sh(["dvc", "exp", "list", "--name-only"], project).strip() == ""
    assert sh(["git", "rev-parse", "HEAD"], project) == head


def test_the_stages_publish_curves_where_dvclive_puts_them():
    assert paths.curves_folder("sft") == Path("dvclive") / "sft" / METRICS_FOLDER


def test_each_epoch_lands_on_its_last_step():
    steps = [
        {"step": s, "epoch": (s + 1) // 2, "lr": 0.1, "train_loss": 1.0 / s} for s in (1, 2, 3)
    ]
    epochs = [{"epoch": 1, "train_loss": 0.75, "val_loss": 0.9}]
    assert curve_points(steps, epochs) == [
        (1, {"lr": 0.1, "train_loss": 1.0}),
        (2, {"lr": 0.1, "train_loss": 0.5, "epoch/train_loss": 0.75, "epoch/val_loss": 0.9}),
        (3, {"lr": 0.1, "train_loss": 1.0 / 3}),
    ]
    assert curve_points(steps[1:2], epochs) == [curve_points(steps, epochs)[1]]  # one at a time
