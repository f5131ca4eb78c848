"""Running a training stage of the trained tiny project as N torchrun workers, for the tests
of data parallelism and sharding, and reading what it wrote."""

import json
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from rlhf.project.metric_files import read_metrics
from rlhf.train.curves import read_curve

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

RL_ONE_STEP = {  # one iteration of one optimizer step: all 8 answers in one minibatch
    "ppo": {"ppo.steps": 1, "ppo.update_epochs": 1, "ppo.minibatch_size": 8},
    "grpo": {
        "grpo.steps": 1,
        "grpo.batch_size": 5,
        "grpo.minibatch_size": 10,
        "grpo.update_epochs": 1,
    },
}
RL_LOSSES = {
    "ppo": ("value_loss", "ptx_loss", "entropy", "approx_kl"),
    "grpo": ("kl_loss", "entropy", "approx_kl"),
}


def stage_project(trained_project, directory, stage, overrides=None):
    project = make_project(directory, overrides)
    for part in STAGE_INPUTS[stage]:
        shutil.copytree(trained_project / part, project / part)
    return project


def run_stage(project, stage, nproc, *args):
    # a crashed worker (SIGSEGV) prints where each thread was, into the failure's message
    env = clean_env() | {
        "RLHF_NPROC": str(nproc),
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", f"rlhf.stages.{stage}", *args],
        cwd=project, env=env, capture_output=True, text=True,
    )  # fmt: skip


def metrics(project, stage):
    """The stage's metrics, with the loss of its training steps from its curves."""
    steps = read_curve(project / "dvclive" / stage / "plots" / "metrics", "train_loss")
    loaded = read_metrics(stage, project)
    return loaded | {"step_losses": [loss for _, loss in steps]}


def assert_close(a, b, keys, rel):
    for key in keys:
        assert a[key] == pytest.approx(b[key], rel=rel, abs=1e-12), (key, a[key], b[key])


def rl_results(project, algorithm):
    """An RL stage's metrics, and its curves (name -> [values by step]) with the answers it
    logged."""
    folder = project / "dvclive" / algorithm / "plots" / "metrics"
    curves = {f.stem: [v for _, v in read_curve(folder, f.stem)] for f in folder.glob("*.tsv")}
    logged = (project / "artifacts" / algorithm / "samples.jsonl").read_text().splitlines()
    answers = [json.loads(line)["response"] for line in logged]
    metrics = read_metrics(algorithm, project)
    # but the sampler/scorer log-prob mismatch: float rounding itself, which another packing
    # of the scored rows moves (held to its bound in tests/stages/test_rl_stage.py)
    metrics = {k: v for k, v in metrics.items() if not k.startswith("logprob_mismatch")}
    return metrics, curves | {"answers": answers}


def rl_run(trained_project, directory, algorithm, nproc, overrides=None):
    """`rl_results` of the stage run at `nproc` processes."""
    project = stage_project(trained_project, directory, "rl", overrides)
    done = run_stage(project, "rl", nproc, algorithm)
    assert done.returncode == 0, done.stderr
    return rl_results(project, algorithm)


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
