"""Training stages as torchrun workers: two gloo processes on this CPU compute what one does,
a killed rank stops the stage at once and the rerun resumes, at any process count."""

import json
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from rlhf.stages.entry import PEER_LOST, USER_ERROR
from rlhf.stages.launch import WorkerFailed, worker_failure
from rlhf.train.curves import read_curve
from rlhf.train.distributed import World

from conftest import clean_env, make_project

STAGE_INPUTS = {  # what each stage reads, copied from the trained tiny project
    "sft": ("data/prepared", "artifacts/tokenizer"),
    "rm": ("data/prepared", "data/collected", "artifacts/tokenizer", "artifacts/sft"),
    "dpo": ("data/prepared", "data/collected", "artifacts/tokenizer", "artifacts/sft"),
    "rl": ("data/prepared", "artifacts/tokenizer", "artifacts/sft", "artifacts/rm"),
}
ONE_STEP = {  # one optimizer step over a global batch several ranks share unevenly
    "sft": {"sft.epochs": 1, "sft.batch_size": 400, "sft.warmup_steps": 0},
    "rm": {"rm.epochs": 1, "rm.batch_size": 1000, "rm.warmup_steps": 0},
    "dpo": {"dpo.epochs": 1, "dpo.batch_size": 1000, "dpo.warmup_steps": 0},
}
LOSSES = {"sft": ("train_loss", "val_loss"), "rm": ("val_loss", "acc_noisy"),
          "dpo": ("val_loss", "reward_accuracy", "reward_margin")}  # fmt: skip


def stage_project(trained_project, directory, stage, overrides=None):
    project = make_project(directory, overrides)
    for part in STAGE_INPUTS[stage]:
        shutil.copytree(trained_project / part, project / part)
    return project


def run_stage(project, stage, nproc, *args):
    env = clean_env() | {"RLHF_NPROC": str(nproc), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", f"rlhf.stages.{stage}", *args],
        cwd=project, env=env, capture_output=True, text=True,
    )  # fmt: skip


def metrics(project, stage):
    """The stage's metrics, with the loss of its training steps from its curves."""
    steps = read_curve(project / "dvclive" / stage / "plots" / "metrics", "train_loss")
    loaded = json.loads((project / "metrics" / f"{stage}.json").read_text())
    return loaded | {"step_losses": [loss for _, loss in steps]}


def assert_close(a, b, keys, rel):
    for key in keys:
        assert a[key] == pytest.approx(b[key], rel=rel, abs=1e-12), (key, a[key], b[key])


@pytest.mark.parametrize("world", [2, 3, 5])
def test_the_ranks_share_every_row_of_a_batch_once(world):
    rows = list(range(11))
    shares = [World(rank=r, size=world).shard(rows) for r in range(world)]
    assert sorted(i for share, holds in shares for i in share) == rows
    assert all(holds for _, holds in shares)
    assert max(len(s) for s, _ in shares) - min(len(s) for s, _ in shares) <= 1
    assert shares[1][0][:2] == [1, 1 + world]  # strided: every rank gets short and long rows
    assert World(rank=2, size=3).shard([4, 5]) == ([4], False)  # forwards a row at weight 0


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "rm", "dpo"])
def test_two_processes_take_the_step_one_takes(trained_project, tmp_path, stage):
    """One step over the whole training set, split 2 ways by rows of unequal size: the
    losses and the validation after the step agree with one process within 1e-5."""
    runs = {}
    for nproc in (1, 2):
        project = stage_project(trained_project, tmp_path / f"n{nproc}", stage, ONE_STEP[stage])
        done = run_stage(project, stage, nproc)
        assert done.returncode == 0, done.stderr
        runs[nproc] = metrics(project, stage)
    assert runs[1]["steps"] == runs[2]["steps"] == 1
    assert runs[2]["step_losses"] == pytest.approx(runs[1]["step_losses"], rel=1e-5)
    assert_close(runs[2], runs[1], LOSSES[stage], rel=1e-5)


@pytest.mark.slow
def test_a_full_tiny_run_at_two_processes_matches_one(trained_project, tmp_path):
    """100 steps: only the summation order differs, which Adam's normalized steps carry on
    (measured 5e-7 relative); 1e-4 is the tolerance."""
    runs = {}
    for nproc in (1, 2):
        project = stage_project(trained_project, tmp_path / f"n{nproc}", "sft")
        assert run_stage(project, "sft", nproc).returncode == 0
        runs[nproc] = metrics(project, "sft")
    assert_close(runs[2], runs[1], LOSSES["sft"], rel=1e-4)
    assert runs[2]["step_losses"] == pytest.approx(runs[1]["step_losses"], rel=1e-4)
    assert runs[2]["steps"] == runs[1]["steps"] == 100


RL_ONE_STEP = {  # one iteration of one optimizer step: all 8 answers in one minibatch
    "ppo": {"ppo.steps": 1, "ppo.update_epochs": 1, "ppo.minibatch_size": 8},
    "grpo": {
        "grpo.steps": 1,
        "grpo.batch_size": 5,
        "grpo.minibatch_size": 10,
        "grpo.update_epochs": 1,
    },
}
RL_LOSSES = {"ppo": ("value_loss", "ptx_loss", "entropy", "approx_kl"),
             "grpo": ("policy_loss", "kl_loss", "entropy", "approx_kl")}  # fmt: skip


def rl_results(project, algorithm):
    """An RL stage's metrics, and its curves (name -> [values by step]) with the answers it
    logged."""
    folder = project / "dvclive" / algorithm / "plots" / "metrics"
    curves = {f.stem: [v for _, v in read_curve(folder, f.stem)] for f in folder.glob("*.tsv")}
    logged = (project / "artifacts" / algorithm / "samples.jsonl").read_text().splitlines()
    answers = [json.loads(line)["response"] for line in logged]
    metrics = json.loads((project / "metrics" / f"{algorithm}.json").read_text())
    return metrics, curves | {"answers": answers}


def rl_run(trained_project, directory, algorithm, nproc, overrides=None):
    """`rl_results` of the stage run at `nproc` processes."""
    project = stage_project(trained_project, directory, "rl", overrides)
    done = run_stage(project, "rl", nproc, algorithm)
    assert done.returncode == 0, done.stderr
    return rl_results(project, algorithm)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_two_processes_take_the_rl_step_one_takes(trained_project, tmp_path, algorithm):
    """Each rank samples, scores and trains on its share of the answers (an odd 5 of GRPO's
    10 each): the rollout is the same answers, every loss of the update agrees within 1e-5,
    and so does the held-out evaluation of the policy after it. The policy loss is a mean of
    whitened, zero-mean advantages: near 0 by construction, it is compared absolutely."""
    runs = {
        n: rl_run(trained_project, tmp_path / f"n{n}", algorithm, n, RL_ONE_STEP[algorithm])
        for n in (1, 2)
    }
    (metrics_1, curves_1), (metrics_2, curves_2) = runs[1], runs[2]
    assert curves_2["answers"] == curves_1["answers"]
    assert curves_2["score"] == pytest.approx(curves_1["score"], rel=1e-6)
    for name in RL_LOSSES[algorithm]:  # a ratio of exactly 1 (KL 0) is 1e-15 apart
        assert curves_2[name] == pytest.approx(curves_1[name], rel=1e-5, abs=1e-12), name
    assert curves_2["policy_loss"] == pytest.approx(curves_1["policy_loss"], abs=1e-7)
    assert metrics_2 == metrics_1


@pytest.mark.slow
def test_a_full_tiny_ppo_run_at_two_processes_matches_one(trained_project, tmp_path):
    """Four iterations of 4 updates each: the answers sampled stay the same, the statistics
    drift only by summation order (measured under 1e-4 relative; a KL that is a difference
    of near-equal log-probs, 1e-5 absolute), and the metrics, at their 4 decimals, agree."""
    (metrics_1, curves_1), (metrics_2, curves_2) = (
        rl_run(trained_project, tmp_path / f"n{n}", "ppo", n) for n in (1, 2)
    )
    assert curves_2["answers"] == curves_1["answers"]
    assert curves_2["score"] == pytest.approx(curves_1["score"], rel=1e-5)
    for name in ("value_loss", "ptx_loss", "entropy", "kl"):
        assert curves_2[name] == pytest.approx(curves_1[name], rel=1e-4, abs=1e-5), name
    assert metrics_2 == metrics_1


def kill_rank_at_first_save(project, rank: int, stage: str = "sft", *args: str):
    """Start a stage as 2 workers, SIGKILL worker `rank` once the resume state is written;
    return the launcher's exit status, its stderr and the seconds it took to stop."""
    env = clean_env() | {"RLHF_NPROC": "2", "OMP_NUM_THREADS": "1"}
    launcher = subprocess.Popen(
        [sys.executable, "-m", f"rlhf.stages.{stage}", *args], cwd=project, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    resume = project / ".rlhf" / "resume" / f"{args[0] if args else stage}.pt"
    deadline = time.monotonic() + 120
    while not resume.exists() and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    workers = psutil.Process(launcher.pid).children(recursive=True)
    victim = next(w for w in workers if w.environ().get("RANK") == str(rank))
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = launcher.communicate(timeout=120)
    return launcher.returncode, stderr, time.monotonic() - killed


@pytest.mark.slow
def test_a_killed_rank_stops_the_stage_at_once_and_the_rerun_resumes(trained_project, tmp_path):
    overrides = {"sft.save_every": 5}
    whole = stage_project(trained_project, tmp_path / "whole", "sft", overrides)
    assert run_stage(whole, "sft", 2).returncode == 0
    for rerun_nproc in (2, 1):  # the resume state holds the full model: any count resumes
        project = stage_project(trained_project, tmp_path / f"killed{rerun_nproc}", "sft",
                                overrides)  # fmt: skip
        status, stderr, seconds = kill_rank_at_first_save(project, rank=1)
        assert status == 75 and seconds < 60  # EX_TEMPFAIL: a scheduler retries, and resumes
        said = [line for line in stderr.splitlines() if line.startswith(("error:", "failed:"))]
        assert said == [
            "failed: rank 1 of 2 was killed by SIGKILL, and the other ranks were stopped; run "
            "the stage again (dvc repro) to resume from its last save (RLHF_DEBUG=1 shows "
            "each rank's traceback)"
        ]
        assert "Traceback" not in stderr  # rank 0's broken collective is not a second report
        assert not (project / "metrics" / "sft.json").exists()
        rerun = run_stage(project, "sft", rerun_nproc)
        assert "sft: resuming from step 5 of 100" in rerun.stderr
        if rerun_nproc == 2:
            assert metrics(project, "sft") == metrics(whole, "sft")
        else:
            resumed = metrics(project, "sft")
            assert_close(resumed, metrics(whole, "sft"), LOSSES["sft"], rel=1e-4)
            assert resumed["step_losses"] == pytest.approx(metrics(whole, "sft")["step_losses"],
                                                           rel=1e-4)  # fmt: skip


@pytest.mark.slow
def test_a_killed_rank_stops_ppo_and_the_rerun_resumes_to_the_same_numbers(
    trained_project, tmp_path
):
    whole = rl_run(trained_project, tmp_path / "whole", "ppo", 2)
    project = stage_project(trained_project, tmp_path / "killed", "rl")
    status, stderr, seconds = kill_rank_at_first_save(project, 1, "rl", "ppo")
    assert status == 75 and seconds < 60
    assert [line for line in stderr.splitlines() if line.startswith("failed:")] == [
        "failed: rank 1 of 2 was killed by SIGKILL, and the other ranks were stopped; run "
        "the stage again (dvc repro) to resume from its last save (RLHF_DEBUG=1 shows "
        "each rank's traceback)"
    ]
    assert not (project / "metrics" / "ppo.json").exists()
    rerun = run_stage(project, "rl", 2, "ppo")
    assert "rl@ppo: resuming from iteration 2 of 4" in rerun.stderr
    assert rl_results(project, "ppo") == whole


def test_the_process_count_changes_no_stage(trained_project, tmp_path):
    """How many processes is the host's business: DVC sees the same stages at any count."""
    project = tmp_path / "p"
    shutil.copytree(trained_project, project, ignore=shutil.ignore_patterns("__pycache__"))
    assert "RLHF_NPROC" not in (project / "dvc.yaml").read_text()
    for nproc in ("1", "2", "auto"):
        status = subprocess.run(
            ["dvc", "status", "--json"], cwd=project, env=clean_env() | {"RLHF_NPROC": nproc},
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert json.loads(status.stdout) == {}


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_process_count_is_one_line(tmp_path, value):
    done = run_stage(make_project(tmp_path / "p"), "sft", value)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: RLHF_NPROC={value!r}: give a number of processes (1, 2, ...) or auto"
    )


def failure(exitcode: int, timestamp: int = 100, signal_name: str = "SIGKILL"):
    """What the elastic agent records of a failed worker (ProcessFailure's fields used)."""
    return SimpleNamespace(exitcode=exitcode, timestamp=timestamp, signal_name=lambda: signal_name)


def test_the_rank_that_failed_is_named_not_the_ones_it_broke():
    # rank 0's collective broke in the same second rank 1 was killed: rank 1 is the cause
    stopped = worker_failure({0: failure(PEER_LOST), 1: failure(-9)}, nproc=2)
    assert isinstance(stopped, WorkerFailed)
    assert str(stopped).startswith("rank 1 of 2 was killed by SIGKILL")
    # the agent stopped rank 0 (SIGTERM) once rank 1 was gone: still rank 1
    terminated = worker_failure({0: failure(-15, signal_name="SIGTERM"), 1: failure(-9)}, 2)
    assert str(terminated).startswith("rank 1 of 2 was killed by SIGKILL")
    crashed = worker_failure({2: failure(1, timestamp=90), 1: failure(-11, timestamp=95)}, 4)
    assert str(crashed).startswith("rank 2 of 4 exited with status 1")
    explained = worker_failure({0: failure(PEER_LOST), 1: failure(USER_ERROR)}, nproc=2)
    assert isinstance(explained, SystemExit) and explained.code == USER_ERROR  # it said why
    everywhere = worker_failure({0: failure(PEER_LOST), 1: failure(PEER_LOST)}, nproc=2)
    assert str(everywhere).startswith("a collective failed on all 2 ranks")
