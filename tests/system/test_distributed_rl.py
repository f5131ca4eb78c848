"""The RL stages as torchrun workers: two gloo processes sample the answers one does and
compute what it does, and a killed rank's stage resumes to the same numbers."""

import pytest
import torch

from stage_runs import (
    RL_LOSSES,
    RL_ONE_STEP,
    kill_rank_at_first_save,
    rl_results,
    rl_run,
    run_stage,
    stage_project,
)

ROWS = {"ppo": 8, "grpo": 10}  # answers in the one step
# a token budget that runs about a row per pass: each rank's share of the minibatch as
# several passes whose gradients add up (as many on each rank: stand-ins where it has fewer)
MICROBATCHES = {"rl.microbatch_tokens": 40}


def summation_bound(curves, algorithm) -> float:
    """How far float32 reordering can move the policy loss, a token mean of terms of size
    about 1 (whitened or group-normalized advantages times a ratio of 1): a sum of n such terms
    taken in another order (each rank's share, then across ranks) moves by at most n * eps."""
    tokens = curves["response_length"][0] * ROWS[algorithm]
    return tokens * torch.finfo(torch.float32).eps


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_two_processes_take_the_rl_step_one_takes(trained_project, tmp_path, algorithm):
    """Each rank samples, scores and trains on its share of the answers (an odd 5 of GRPO's
    10 each), in microbatches of about a row (the gradients added up before the one step):
    the rollout is the same answers, every loss of the update agrees within 1e-5,
    and so does the held-out evaluation of the policy after it. The policy loss is a mean of
    normalized advantages, near 0 by construction: it is compared absolutely, within what
    summing its terms in another order explains (measured 2e-7 to 8e-7). The same holds
    with PPO's policy and critic sharded (FSDP2) rather than replicated."""
    one_step = RL_ONE_STEP[algorithm]
    metrics_1, curves_1 = rl_run(trained_project, tmp_path / "n1", algorithm, 1, one_step)
    for strategy in ("ddp", "fsdp2") if algorithm == "ppo" else ("ddp",):
        overrides = one_step | {"train.strategy": strategy} | MICROBATCHES
        metrics_2, curves_2 = rl_run(trained_project, tmp_path / strategy, algorithm, 2, overrides)
        assert curves_2["answers"] == curves_1["answers"]
        assert curves_2["score"] == pytest.approx(curves_1["score"], rel=1e-6)
        for name in RL_LOSSES[algorithm]:  # a ratio of exactly 1 (KL 0) is 1e-15 apart
            assert curves_2[name] == pytest.approx(curves_1[name], rel=1e-5, abs=1e-12), name
        bound = summation_bound(curves_1, algorithm)
        assert curves_2["policy_loss"] == pytest.approx(curves_1["policy_loss"], abs=bound)
        assert metrics_2 == metrics_1, strategy


@pytest.fixture(scope="module")
def sharded_ppo(trained_project, tmp_path_factory):
    """A whole tiny PPO run at 2 processes, policy and critic sharded: what one process
    computes, and what a killed rank's rerun must end with."""
    return rl_run(
        trained_project, tmp_path_factory.mktemp("sharded"), "ppo", 2, {"train.strategy": "fsdp2"}
    )


@pytest.mark.slow
def test_a_full_tiny_ppo_run_at_two_processes_matches_one(trained_project, tmp_path, sharded_ppo):
    """Four iterations of 4 updates each, at 2 processes with the policy and critic
    replicated (DDP) or sharded (FSDP2; sampling on the policy gathered once per rollout):
    the answers sampled stay the same, the statistics drift only by summation order
    (measured about 1e-6 relative; a KL that is a difference of near-equal log-probs, 1e-5
    absolute), and the metrics, at their 4 decimals, agree. One process is the shared trained
    project's own PPO stage: the same params and thread count write the same bytes."""
    metrics_1, curves_1 = rl_results(trained_project, "ppo")
    replicated = rl_run(trained_project, tmp_path / "ddp", "ppo", 2, {"train.strategy": "ddp"})
    for strategy, (metrics_2, curves_2) in (("ddp", replicated), ("fsdp2", sharded_ppo)):
        assert curves_2["answers"] == curves_1["answers"]
        assert curves_2["score"] == pytest.approx(curves_1["score"], rel=1e-5)
        for name in ("value_loss", "ptx_loss", "entropy", "kl"):
            assert curves_2[name] == pytest.approx(curves_1[name], rel=1e-4, abs=1e-5), name
        assert metrics_2 == metrics_1, strategy


@pytest.mark.slow
def test_sharded_lora_ppo_matches_replicated_lora_ppo(trained_project, tmp_path):
    """LoRA adapters on a sharded policy and critic (the gathered copies rebuild them): a
    whole tiny run samples the answers DDP samples, its curves agree within 1e-4 and its
    metrics exactly."""
    adapters = {"rl.lora_rank": 4, "ppo.lr": 1e-2}
    (metrics_ddp, curves_ddp), (metrics_fsdp2, curves_fsdp2) = (
        rl_run(trained_project, tmp_path / s, "ppo", 2, adapters | {"train.strategy": s})
        for s in ("ddp", "fsdp2")
    )
    assert curves_fsdp2["answers"] == curves_ddp["answers"]
    for name in ("score", "value_loss", "ptx_loss", "entropy", "kl", "policy_loss"):
        assert curves_fsdp2[name] == pytest.approx(curves_ddp[name], rel=1e-4, abs=1e-5), name
    assert metrics_fsdp2 == metrics_ddp


@pytest.mark.slow
def test_a_killed_rank_stops_ppo_and_the_rerun_resumes_to_the_same_numbers(
    trained_project, tmp_path, sharded_ppo
):
    """Sharded (the resume state gathered whole from the shards); a replicated policy's
    resume: tests/stages/test_rl_stage.py, and a killed replicated rank:
    tests/system/test_distributed.py."""
    project = stage_project(trained_project, tmp_path / "killed", "rl", {"train.strategy": "fsdp2"})
    status, stderr, seconds = kill_rank_at_first_save(project, 1, "rl", "ppo")
    assert status == 75 and seconds < 60
    assert [line for line in stderr.splitlines() if line.startswith("failed:")] == [
        "failed: rank 1 of 2 was killed by SIGKILL, and the other ranks were stopped; run "
        "the stage again (dvc repro) to resume from its last save (RLHF_DEBUG=1 shows "
        "each rank's traceback)"
    ]
    assert not (project / "metrics" / "details" / "ppo.json").exists()
    rerun = run_stage(project, "rl", 2, "ppo")
    assert "rl@ppo: resuming from iteration 2 of 4" in rerun.stderr
    assert rl_results(project, "ppo") == sharded_ppo
