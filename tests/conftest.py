"""Shared fixtures: a tiny pipeline configuration that trains in seconds on a CPU."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from rlhf.cpu import pin_kernels
from rlhf.models import checkpoint
from rlhf.models.gpt import GPT, GPTConfig
from rlhf.params.groups import ParamsFile
from rlhf.project.metric_files import read_metrics
from rlhf.tokenizer.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]

TINY_PARAMS = {
    "seed": 7,
    # RLHF_TEST_DEVICE=cuda runs the tiny pipeline on a GPU host
    "device": os.environ.get("RLHF_TEST_DEVICE", "cpu"),
    "threads": 1,  # two tests at a time on two cores (pytest -n 2)
    "cpu_kernels": ParamsFile().cpu_kernels,
    "rl_algorithms": ["ppo", "grpo"],
    "tokenizer": {"kind": "bpe", "vocab_size": 400},
    "model": {"init": "scratch", "n_layer": 2, "n_head": 2, "n_embd": 48, "block_size": 64},
    "memory": {"activation_checkpointing": False, "frozen_bf16": False},
    "train": {"strategy": "ddp"},
    "data": {"n_train": 400, "n_val": 48, "n_heldout": 36, "n_prompts": 60},
    "sft": {
        "epochs": 4,
        "batch_size": 16,
        "lr": 0.01,
        "warmup_steps": 5,
        "save_every": 5,
        "eval_max_new_tokens": 12,
    },
    "collect": {"k": 3, "mismatched": 1, "explore": 1, "max_new_tokens": 12, "val_fraction": 0.2},
    "rm": {"epochs": 1, "batch_size": 8, "lr": 0.002, "warmup_steps": 2, "norm_samples": 64},
    "rl": {
        "max_new_tokens": 12,
        "save_every": 2,
        "snapshot_every": 2,
        "log_samples_every": 2,
        "eval_samples": 1,
    },
    "ppo": {
        "steps": 4,
        "batch_size": 8,
        "minibatch_size": 4,
        "update_epochs": 2,
        "kl_coef": 0.2,  # in the file so that `dvc exp run -S ppo.kl_coef=...` can override it
        "ptx_coef": 0.5,
        "ptx_batch_size": 4,
    },
    "grpo": {"steps": 4, "batch_size": 4, "group_size": 2, "minibatch_size": 4},
    "dpo": {"epochs": 2, "batch_size": 8, "lr": 0.001, "warmup_steps": 2, "save_every": 2},
    # one sample per prompt, as ppo.eval_samples: the two evaluations must then agree exactly
    "evaluate": {
        "samples": 1,
        "curve_samples": 1,
        "max_new_tokens": 12,
        "bootstrap_resamples": 200,
        "examples_per_task": 1,
        "temperatures": [0.7, 1.0],
        "sweep_samples": 1,
        "bon_n": [2, 4],
        "bon_pool": 4,
    },
}

# The kernels a stage pins, before any test's first tensor operation: a stage run in a test's
# own process then computes as one in a stage process does (and finds them pinned already).
pin_kernels(TINY_PARAMS["cpu_kernels"])


def write_params(directory: Path, overrides: dict | None = None) -> Path:
    params = {k: (dict(v) if isinstance(v, dict) else v) for k, v in TINY_PARAMS.items()}
    for key, value in (overrides or {}).items():
        group, _, name = key.partition(".")
        if name:
            params.setdefault(group, {})[name] = value
        else:
            params[group] = value
    path = directory / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def make_project(directory: Path, overrides: dict | None = None) -> Path:
    """A DVC project with this repo's pipeline, code and a tiny params.yaml."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "rlhf", directory / "rlhf", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", "prefect.yaml", "docker-work-pool.json", ".gitignore"):
        shutil.copy(REPO / name, directory / name)
    shutil.copytree(REPO / "data" / "raw", directory / "data" / "raw")
    write_params(directory, overrides)
    return directory


def init_dvc_repo(project: Path) -> Path:
    """Make `project` a git repository with DVC initialized, as a user's clone is."""
    for args in (
        ["git", "init", "-q"],
        ["dvc", "init", "-q"],
        ["dvc", "config", "core.analytics", "false"],
    ):
        subprocess.run(args, cwd=project, env=clean_env(), capture_output=True, check=True)
    # the plot templates dvc.yaml names, which a clone has in its .dvc/
    shutil.copytree(REPO / ".dvc" / "plots", project / ".dvc" / "plots")
    return project


@functools.cache
def import_seconds(module: str) -> float:
    """How long importing `module` takes here, now: what a command pays before it reads its
    input, and what a loaded machine (the suite's other worker) stretches. A bound on a
    command that must not hang is on what it takes beyond that."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, env=clean_env())
    return time.monotonic() - started


def run_module(module: str, cwd: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=clean_env(),
        check=True,
        **kwargs,
    )


def start_until_saved(project: Path, module: str, resume: Path, *args: str) -> subprocess.Popen:
    """Start a stage and return it, running, as soon as it has written its resume state."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args], cwd=project, env=clean_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not resume.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert resume.exists(), f"{module} ended before writing resume state"
    return proc


def kill_at_first_save(project: Path, module: str, resume: Path, *args: str) -> Path:
    """Run a stage and SIGKILL it as soon as it has written its resume state."""
    proc = start_until_saved(project, module, resume, *args)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    return resume


def curves(project: Path, name: str) -> dict[str, bytes]:
    """The training curves stage `name` published: metric -> its dvclive TSV, as bytes."""
    folder = project / "dvclive" / name / "plots" / "metrics"
    return {str(p.relative_to(folder))[: -len(".tsv")]: p.read_bytes() for p in folder.rglob("*")
            if p.is_file()}  # fmt: skip


def assert_resume_matches(project: Path, trained: Path, stage: str, resume: Path) -> None:
    """Rerun a killed `stage` in `project`: it must resume where it was killed, end with the
    metrics and training curves of the uninterrupted run in `trained` (each step once, none
    twice from before the kill) and delete its resume state and live curves."""
    killed_at = checkpoint.load(resume)["step"]
    assert killed_at > 0
    rerun = run_module(f"rlhf.stages.{stage}", project)
    assert f"resuming from step {killed_at}" in rerun.stderr
    resumed, uninterrupted = (read_metrics(stage, p) for p in (project, trained))
    assert resumed == uninterrupted
    assert curves(project, stage) == curves(trained, stage)
    assert not resume.exists() and not (project / ".rlhf" / "live" / stage).exists()


def safetensors_parts(path: Path) -> tuple[dict, bytes]:
    """A safetensors file's header (JSON) and the data after it, to damage one of them."""
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def write_safetensors(path: Path, header: dict | bytes, data: bytes) -> None:
    """A safetensors file of `header` (JSON, or its bytes as they are) and `data`."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)


def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    env["DVC_NO_ANALYTICS"] = "1"
    env["PYTHONPATH"] = ""
    for role in ("AUTHOR", "COMMITTER"):  # CI's user may have no git identity
        env.setdefault(f"GIT_{role}_NAME", "rlhf tests")
        env.setdefault(f"GIT_{role}_EMAIL", "tests@rlhf-pipeline.invalid")
    return env


@pytest.fixture(scope="module")
def prefect_server():
    """A temporary Prefect server per test module: deployments one module registers do not
    replace another's."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield PREFECT_API_URL.value()


def prefect_env(server: str) -> dict[str, str]:
    """The environment of a command that talks to `server`: `rlhf deploy`, a worker."""
    return clean_env() | {
        "PREFECT_API_URL": server,
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
    }


def sh(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a command in `cwd` (in `env`, else the tests' clean one); its stdout, or a
    failure with everything it said."""
    done = subprocess.run(args, cwd=cwd, env=env or clean_env(), capture_output=True, text=True)
    assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    return done.stdout


def stages_ran(dvc_output: str) -> set[str]:
    """The stages a `dvc repro` (or `dvc exp run`) ran, from its own log."""
    return set(re.findall(r"Running stage '([\w@-]+)'", dvc_output))


def use_repository_dvc_config(project: Path) -> None:
    """The repository's own DVC config in `project`: its default remote and the offline
    template `dvc plots show` fills in."""
    for name in ("config", "offline-plots.html"):
        shutil.copy(REPO / ".dvc" / name, project / ".dvc" / name)


def shared_project(trained: Path, directory: Path) -> Path:
    """A copy of the trained project as a team shares it: the repository's DVC config (its
    default local remote, `rlhf-pipeline-storage` beside the project), everything committed
    to git and every output pushed to that remote."""
    shutil.copytree(trained, directory, ignore=shutil.ignore_patterns("__pycache__"))
    use_repository_dvc_config(directory)
    sh(["git", "add", "-A"], directory)
    sh(["git", "commit", "-q", "-m", "trained on the tiny config"], directory)
    sh(["dvc", "push", "-q"], directory)
    return directory


# the files of a minute or more (on two cores) among those that start from the trained
# project, longest first (measured: 389 s down to 62 s of one worker), handed out first and in
# this order, so that no worker starts a long one while the others run out of work
LONGEST = (
    "test_flows.py", "test_distributed.py", "test_distributed_rl.py", "test_seeds.py",
    "test_dvc.py", "test_reliability.py", "test_code_deps.py", "test_sharded.py",
    "test_mlflow.py", "test_retries.py",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that need the trained project run after those that do not, but for the first
    of them, and the longest of them first: under pytest-xdist (`--dist loadfile
    --no-loadscope-reorder`, which hands files out in this order) one worker builds the
    project (about a minute) while the others run the independent files, where they would
    otherwise wait on its lock, and the run ends on short files (the workers' last tests
    ended 124 s apart when the long files went in collection order, 40 s apart longest
    first)."""
    needing = [item.path for item in items if "trained_project" in item.fixturenames]
    later = set(needing[1:]) - {needing[0]} if needing else set()

    def turn(item: pytest.Item) -> int:
        if item.path not in later:
            return 0
        name = item.path.name
        return 1 + (LONGEST.index(name) if name in LONGEST else len(LONGEST))

    items.sort(key=turn)  # stable: each group keeps its order


@pytest.fixture(scope="session")
def trained_project(tmp_path_factory) -> Path:
    """Every stage on the tiny config, run once for the whole test run by `dvc repro` in a git
    + DVC project: under pytest-xdist
    the first worker to ask builds it while the others wait on a file lock, then all share it
    (tests copy it before changing anything)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return train_tiny(tmp_path_factory.mktemp("trained"))
    from filelock import FileLock  # a dev dependency; GPU hosts run the tests without xdist

    shared = tmp_path_factory.getbasetemp().parent / "trained"
    with FileLock(f"{shared}.lock"):
        if not (shared / "metrics" / "details" / "eval.json").exists():
            shutil.rmtree(shared, ignore_errors=True)  # a worker that died building it
            train_tiny(shared)
    return shared


FIRST_REPRO_LOG = Path(".dvc") / "tmp" / "first-repro.log"  # in DVC's own scratch folder


def train_tiny(directory: Path) -> Path:
    """A fresh git + DVC project run through `dvc repro`, as a user's first run is; DVC's
    output is kept in FIRST_REPRO_LOG for the tests of that first run."""
    project = init_dvc_repo(make_project(directory))
    done = subprocess.run(
        ["dvc", "repro"], cwd=project, env=clean_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (project / FIRST_REPRO_LOG).write_text(done.stdout)
    return project


def tiny_gpt(tokenizer: Tokenizer, seed: int) -> GPT:
    """A random one-layer GPT of width 16 over `tokenizer`'s vocabulary, the same for a seed:
    the smallest model the sampling, KL and RL code run on."""
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=tokenizer.vocab_size, block_size=48, n_layer=1, n_head=2, n_embd=16
    )
    return GPT(config)
