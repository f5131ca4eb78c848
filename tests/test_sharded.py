"""`train.strategy: fsdp2`: the model sharded across two gloo processes (torch's
`fully_shard`, a unit per transformer block) trains as the replicated DDP model does, writes
the whole model, and resumes from a whole-model state."""

import pytest
import torch

from rlhf.models import checkpoint
from rlhf.models.gpt import GPT, GPTConfig
from rlhf.models.llama import Llama, LlamaConfig

from conftest import kill_at_first_save
from stage_runs import (
    LOSSES,
    ONE_STEP,
    assert_close,
    kill_rank_at_first_save,
    metrics,
    run_stage,
    stage_project,
)

SHARDED = {"train.strategy": "fsdp2"}


def test_every_backbone_names_its_blocks_in_order():
    gpt = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=3, n_head=2, n_embd=16))
    llama = Llama(LlamaConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16))
    assert gpt.transformer_blocks() == list(gpt.blocks)
    assert llama.transformer_blocks() == list(llama.layers)


def trained(trained_project, directory, stage, overrides):
    project = stage_project(trained_project, directory, stage, overrides)
    done = run_stage(project, stage, 2)
    assert done.returncode == 0, done.stderr
    return project


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "rm", "dpo"])
def test_sharded_and_replicated_take_the_same_step(trained_project, tmp_path, stage):
    """One step over the whole training set at 2 processes: the losses, the validation and
    the model written agree within 1e-5."""
    ddp = trained(trained_project, tmp_path / "ddp", stage, ONE_STEP[stage])
    fsdp2 = trained(trained_project, tmp_path / "fsdp2", stage, ONE_STEP[stage] | SHARDED)
    replicated, sharded = metrics(ddp, stage), metrics(fsdp2, stage)
    assert sharded["step_losses"] == pytest.approx(replicated["step_losses"], rel=1e-5)
    assert_close(sharded, replicated, LOSSES[stage], rel=1e-5)
    weights = [
        checkpoint.load(project / "artifacts" / stage / "model.pt")["model"]
        for project in (ddp, fsdp2)
    ]
    assert weights[0].keys() == weights[1].keys()
    for name, tensor in weights[0].items():  # whole tensors, not shards
        torch.testing.assert_close(weights[1][name], tensor, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_a_full_sharded_run_matches_the_replicated_one(trained_project, tmp_path):
    """100 SFT steps: only the order of float sums differs (measured 1e-6 relative); 1e-4 is
    the tolerance, as between 1 and 2 processes."""
    replicated = metrics(trained(trained_project, tmp_path / "ddp", "sft", {}), "sft")
    sharded = metrics(trained(trained_project, tmp_path / "fsdp2", "sft", SHARDED), "sft")
    assert sharded["steps"] == replicated["steps"] == 100
    assert_close(sharded, replicated, LOSSES["sft"], rel=1e-4)
    assert sharded["step_losses"] == pytest.approx(replicated["step_losses"], rel=1e-4)


@pytest.mark.slow
def test_a_killed_sharded_run_resumes_to_the_same_numbers(trained_project, tmp_path):
    """The resume state holds the whole model and optimizer, gathered from the shards: the
    rerun picks up at the save and ends where an uninterrupted run ends."""
    overrides = SHARDED | {"sft.save_every": 5}
    whole = trained(trained_project, tmp_path / "whole", "sft", overrides)
    project = stage_project(trained_project, tmp_path / "killed", "sft", overrides)
    status, _, seconds = kill_rank_at_first_save(project, rank=1)
    assert status == 75 and seconds < 60
    saved = checkpoint.load(project / ".rlhf" / "resume" / "sft.pt")["model"]
    written = checkpoint.load(whole / "artifacts" / "sft" / "model.pt")["model"]
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in written.items()}
    rerun = run_stage(project, "sft", 2)
    assert rerun.returncode == 0, rerun.stderr
    assert "sft: resuming from step 5 of 100" in rerun.stderr
    assert metrics(project, "sft") == metrics(whole, "sft")


@pytest.mark.slow
def test_a_state_saved_by_one_process_resumes_sharded_across_two(trained_project, tmp_path):
    """One resume format whichever way the model was held: a run killed at 1 process goes on
    sharded across 2 and ends where an uninterrupted run ends, within 1e-4."""
    overrides = SHARDED | {"sft.save_every": 5}
    whole = stage_project(trained_project, tmp_path / "whole", "sft", overrides)
    assert run_stage(whole, "sft", 1).returncode == 0
    project = stage_project(trained_project, tmp_path / "killed", "sft", overrides)
    kill_at_first_save(project, "rlhf.stages.sft", project / ".rlhf" / "resume" / "sft.pt")
    rerun = run_stage(project, "sft", 2)
    assert rerun.returncode == 0, rerun.stderr
    assert "sft: resuming from step 5 of 100" in rerun.stderr
    resumed, uninterrupted = metrics(project, "sft"), metrics(whole, "sft")
    assert_close(resumed, uninterrupted, LOSSES["sft"], rel=1e-4)
    assert resumed["step_losses"] == pytest.approx(uninterrupted["step_losses"], rel=1e-4)
