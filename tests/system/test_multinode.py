"""Beyond one machine: a stage started by plain `torchrun` on two nodes runs as workers
(`WORLD_SIZE` set) and computes what one process does. The two nodes are two launchers on
this machine, one process each, meeting at a c10d rendezvous on localhost over gloo; they
share the project folder, as nodes share a network file system (rank 0 writes the outputs)."""

import socket
import subprocess
import sys
import uuid

import pytest

from conftest import clean_env
from stage_runs import (
    LOSSES,
    ONE_STEP,
    RL_ONE_STEP,
    assert_close,
    metrics,
    rl_results,
    run_stage,
    stage_project,
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def run_on_two_nodes(project, stage: str, *args: str) -> None:
    """`torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d` twice, as on two hosts:
    the first launcher to bind the endpoint hosts the rendezvous, the other joins it."""
    rendezvous = [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"localhost:{free_port()}", "--rdzv-id", uuid.uuid4().hex,
    ]  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", *rendezvous,
               "-m", f"rlhf.stages.{stage}", *args]  # fmt: skip
    env = clean_env() | {"OMP_NUM_THREADS": "1"}
    piped = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    nodes = [subprocess.Popen(command, cwd=project, env=env, **piped) for _ in range(2)]
    for node in nodes:
        said, _ = node.communicate(timeout=600)
        assert node.returncode == 0, said


@pytest.mark.slow
def test_sft_on_two_nodes_takes_the_step_one_process_takes(trained_project, tmp_path):
    one = stage_project(trained_project, tmp_path / "one", "sft", ONE_STEP["sft"])
    assert run_stage(one, "sft", 1).returncode == 0
    two = stage_project(trained_project, tmp_path / "two", "sft", ONE_STEP["sft"])
    run_on_two_nodes(two, "sft")
    single, nodes = metrics(one, "sft"), metrics(two, "sft")
    assert nodes["steps"] == single["steps"] == 1
    assert nodes["step_losses"] == pytest.approx(single["step_losses"], rel=1e-5)
    assert_close(nodes, single, LOSSES["sft"], rel=1e-5)


@pytest.mark.slow
def test_ppo_on_two_nodes_samples_and_scores_what_one_process_does(trained_project, tmp_path):
    """The same answers, scores and held-out evaluation; the update's losses within 1e-5
    (summation order, as two processes on one node: `test_distributed_rl.py`)."""
    one = stage_project(trained_project, tmp_path / "one", "rl", RL_ONE_STEP["ppo"])
    assert run_stage(one, "rl", 1, "ppo").returncode == 0
    two = stage_project(trained_project, tmp_path / "two", "rl", RL_ONE_STEP["ppo"])
    run_on_two_nodes(two, "rl", "ppo")
    (metrics_1, curves_1), (metrics_2, curves_2) = rl_results(one, "ppo"), rl_results(two, "ppo")
    assert curves_2["answers"] == curves_1["answers"]
    assert curves_2["score"] == pytest.approx(curves_1["score"], rel=1e-6)
    for name in ("value_loss", "ptx_loss", "entropy"):
        assert curves_2[name] == pytest.approx(curves_1[name], rel=1e-5, abs=1e-12), name
    assert metrics_2 == metrics_1
