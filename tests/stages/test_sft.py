import json
import shutil

import torch

from rlhf.models import checkpoint
from rlhf.project.metric_files import read_metrics
from rlhf.tokenizer.tokenizer import load_tokenizer
from rlhf.train.curves import read_curve

from conftest import (
    assert_resume_matches,
    curves,
    kill_at_first_save,
    make_project,
    run_module,
    write_params,
)

METRIC_KEYS = {"val_loss", "gold_greedy", "gold_sampled"}


def metrics_of(project):
    return read_metrics("sft", project)


def test_sft_learns_and_reports_the_contract_metrics(trained_project):
    metrics = metrics_of(trained_project)
    assert set(metrics) >= METRIC_KEYS
    assert "tokens_per_s" not in metrics  # a rerun would change it: kept in timings/
    timings = json.loads((trained_project / "timings" / "sft.json").read_text())
    assert timings["tokens_per_s"] > 0
    folder = trained_project / "dvclive" / "sft" / "plots" / "metrics"
    assert set(curves(trained_project, "sft")) == {
        "lr", "train_loss", "epoch/train_loss", "epoch/val_loss"
    }  # fmt: skip
    val = [value for _, value in read_curve(folder, "epoch/val_loss")]
    assert val[-1] < val[0] < 5.0  # validation loss falls over training
    assert metrics["gold_greedy"] > metrics["gold_greedy_untrained"] + 0.1
    assert set(metrics["gold_greedy_by_task"]) == {
        "greet", "add", "capital", "repeat", "refuse", "uppercase"
    }  # fmt: skip
    steps = [step for step, _ in read_curve(folder, "train_loss")]
    assert steps == list(range(1, metrics["steps"] + 1))
    epoch_ends = [step for step, _ in read_curve(folder, "epoch/val_loss")]
    assert epoch_ends[-1] == metrics["steps"] and len(epoch_ends) == len(val)


def test_checkpoint_loads_weights_only_with_identity(trained_project):
    path = trained_project / "artifacts" / "sft" / "model.pt"
    payload = torch.load(path, map_location="cpu", weights_only=True)
    tokenizer = load_tokenizer(trained_project / "artifacts" / "tokenizer")
    assert payload["tokenizer"] == tokenizer.identity
    assert payload["kind"] == "policy" and len(payload["params_hash"]) == 16
    model, _ = checkpoint.load_model(path, tokenizer)
    assert model.config.vocab_size == tokenizer.vocab_size
    assert not (trained_project / ".rlhf" / "resume" / "sft.pt").exists()


def kill_sft_at_first_save(project, trained_project):
    """Run sft on the trained project's prepared data and tokenizer and SIGKILL it as soon as
    it has saved resume state."""
    for inputs in ("data/prepared", "artifacts/tokenizer"):
        shutil.copytree(trained_project / inputs, project / inputs)
    return kill_at_first_save(project, "rlhf.stages.sft", project / ".rlhf" / "resume" / "sft.pt")


def test_killed_sft_resumes_and_matches_an_uninterrupted_run(trained_project, tmp_path):
    project = make_project(tmp_path / "p")
    resume = kill_sft_at_first_save(project, trained_project)
    assert not (project / "artifacts" / "sft" / "model.pt").exists()  # no half output
    assert_resume_matches(project, trained_project, "sft", resume)


def test_resume_state_from_other_params_is_ignored(trained_project, tmp_path):
    project = make_project(tmp_path / "p")
    kill_sft_at_first_save(project, trained_project)
    write_params(project, {"sft.lr": 0.02})
    rerun = run_module("rlhf.stages.sft", project)
    assert "resuming" not in rerun.stderr
