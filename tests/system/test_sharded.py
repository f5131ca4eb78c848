"""`train.strategy: fsdp2`: the model sharded across two gloo processes (torch's
`fully_shard`, a unit per transformer block) resumes from a whole-model state, its own or one
process's. (That it trains as the replicated model does: tests/system/test_distributed.py.)"""

import pytest

from rlhf.models import checkpoint
from rlhf.models.gpt import GPT, GPTConfig
from rlhf.models.llama import Llama, LlamaConfig

from conftest import kill_at_first_save
from stage_runs import (
    LOSSES,
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
def test_a_sharded_run_resumes_at_another_process_count(trained_project, tmp_path):
    """The resume state holds the whole model and optimizer, in one format whichever way the
    model was held: a sharded run killed at 2 processes goes on at 1, and a run killed at 1
    goes on sharded across 2, each ending where the uninterrupted sharded run ends (within
    1e-4: the order of float sums differs between counts). The rerun at the same count is
    exact: tests/system/test_distributed_rl.py."""
    overrides = SHARDED | {"sft.save_every": 5, "sft.epochs": 2}
    whole = trained(trained_project, tmp_path / "whole", "sft", overrides)
    uninterrupted = metrics(whole, "sft")
    written = checkpoint.load(whole / "artifacts" / "sft" / "model.pt")["model"]
    for killed_at, rerun_at in ((2, 1), (1, 2)):
        project = stage_project(trained_project, tmp_path / f"killed{killed_at}", "sft", overrides)
        resume = project / ".rlhf" / "resume" / "sft.pt"
        if killed_at == 2:
            status, _, seconds = kill_rank_at_first_save(project, rank=1)
            assert status == 75 and seconds < 60
            saved = checkpoint.load(resume)["model"]  # gathered from the shards: whole
            assert {k: v.shape for k, v in saved.items()} == {
                k: v.shape for k, v in written.items()
            }
        else:
            kill_at_first_save(project, "rlhf.stages.sft", resume)
        rerun = run_stage(project, "sft", rerun_at)
        assert rerun.returncode == 0, rerun.stderr
        assert "sft: resuming from step 5 of 50" in rerun.stderr
        resumed = metrics(project, "sft")
        assert_close(resumed, uninterrupted, LOSSES["sft"], rel=1e-4)
        assert resumed["step_losses"] == pytest.approx(uninterrupted["step_losses"], rel=1e-4)
