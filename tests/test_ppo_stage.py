import csv
import json
import shutil

import torch

from rlhf import checkpoint
from rlhf.data import PROMPT_SCHEMA, read_rows
from rlhf.params import PPOParams
from rlhf.ppo_trainer import PPOTrainer, critic_from_reward_model
from rlhf.reward import score
from rlhf.rewards import RuleScorer, make_scorer
from rlhf.rules import contains_number
from rlhf.tokenizer import load_tokenizer

from conftest import kill_at_first_save, make_project, run_module

PPO_KEYS = {"score", "kl", "steps", "rollout_tokens_per_s", "gold_sampled", "win_rate_vs_sft"}
STEP_COLUMNS = {
    "score", "non_score_reward", "kl", "beta", "approx_kl", "clip_fraction",
    "value_clip_fraction", "entropy", "explained_variance", "response_length", "end_token_rate",
    "rollout_tokens_per_s", "update_tokens_per_s", "rollout_s", "scoring_s", "update_s", "ptx_loss",
}  # fmt: skip
TIMING = {"rollout_tokens_per_s", "update_tokens_per_s", "rollout_s", "scoring_s", "update_s"}


def ppo_metrics(project):
    return json.loads((project / "metrics" / "ppo.json").read_text())


def ppo_steps(project):
    with open(project / "metrics" / "ppo_steps.csv") as f:
        return list(csv.DictReader(f))


def test_ppo_metrics_steps_samples_and_checkpoint(trained_project):
    metrics = ppo_metrics(trained_project)
    assert set(metrics) >= PPO_KEYS | {"kl_to_sft", "gold_sampled_sft"}
    assert metrics["steps"] == 4 and 0.0 <= metrics["win_rate_vs_sft"] <= 1.0
    steps = ppo_steps(trained_project)
    assert [int(r["step"]) for r in steps] == [1, 2, 3, 4]
    assert set(steps[0]) >= STEP_COLUMNS
    samples = (trained_project / "artifacts" / "ppo" / "samples.jsonl").read_text().splitlines()
    assert {json.loads(s)["step"] for s in samples} == {1, 2, 4}
    payload = torch.load(
        trained_project / "artifacts" / "ppo" / "model.pt", map_location="cpu", weights_only=True
    )
    assert payload["kind"] == "policy" and payload["step"] == 4
    snapshots = trained_project / "artifacts" / "ppo" / "snapshots"
    assert sorted(p.name for p in snapshots.iterdir()) == ["step_00002.pt"]  # not the last step
    assert not (trained_project / ".rlhf" / "resume" / "ppo.pt").exists()
    assert not (trained_project / ".rlhf" / "resume" / "ppo_snapshots").exists()


def project_ready_for_ppo(trained_project, directory):
    project = make_project(directory)
    shutil.copytree(trained_project / "data" / "prepared", project / "data" / "prepared")
    for name in ("tokenizer", "sft", "rm"):
        shutil.copytree(trained_project / "artifacts" / name, project / "artifacts" / name)
    return project


def test_killed_ppo_resumes_and_matches_an_uninterrupted_run(trained_project, tmp_path):
    project = project_ready_for_ppo(trained_project, tmp_path / "p")
    resume = kill_at_first_save(project, "stages.ppo", project / ".rlhf" / "resume" / "ppo.pt")
    assert not (project / "metrics" / "ppo.json").exists()
    killed_at = checkpoint.load(resume)["trainer"]["step"]

    rerun = run_module("stages.ppo", project)
    assert f"resuming from iteration {killed_at}" in rerun.stderr
    resumed, uninterrupted = ppo_metrics(project), ppo_metrics(trained_project)
    for metrics in (resumed, uninterrupted):
        for key in [k for k in metrics if k.startswith("seconds_") or k in TIMING]:
            metrics.pop(key)
    assert resumed == uninterrupted
    strip = [{k: v for k, v in r.items() if k not in TIMING} for r in ppo_steps(project)]
    assert strip == [
        {k: v for k, v in r.items() if k not in TIMING} for r in ppo_steps(trained_project)
    ]
    # the snapshot taken before the kill is published, identical to the uninterrupted one
    snapshot = "artifacts/ppo/snapshots/step_00002.pt"
    resumed_weights = checkpoint.load(project / snapshot)["model"]
    for name, tensor in checkpoint.load(trained_project / snapshot)["model"].items():
        assert torch.equal(resumed_weights[name], tensor), name


def number_share(trainer, prompts, seed) -> float:
    from rlhf.policy_eval import sample_policy

    samples = sample_policy(
        trainer.policy, trainer.tokenizer, prompts, n=2, config=trainer.sampling, seed=seed,
        batch_size=128,
    )  # fmt: skip
    return sum(contains_number("", r) for r in samples.responses) / len(samples.responses)


def test_rule_reward_contains_number_is_learned(trained_project):
    """The learning signal is real: a rule reward moves what the policy says."""
    tokenizer = load_tokenizer(trained_project / "artifacts" / "tokenizer")
    sft = trained_project / "artifacts" / "sft" / "model.pt"
    policy, reference = (checkpoint.load_model(sft, tokenizer)[0] for _ in range(2))
    critic = critic_from_reward_model(
        checkpoint.load_model(trained_project / "artifacts" / "rm" / "model.pt", tokenizer)[0]
    )
    rows = read_rows(trained_project / "data" / "prepared" / "prompts_train.parquet", PROMPT_SCHEMA)
    prompts = sorted({r["prompt"] for r in rows})
    cfg = PPOParams(
        batch_size=32, minibatch_size=16, ppo_epochs=2, lr=2e-3, kl_coef=0.01, max_new_tokens=12
    )
    torch.manual_seed(0)
    trainer = PPOTrainer(
        policy, reference, critic, RuleScorer(contains_number), tokenizer, cfg,
        total_steps=30, seed=0,
    )  # fmt: skip
    before = number_share(trainer, prompts, seed=1)
    for step in range(30):
        trainer.iteration([prompts[(step * 32 + i) % len(prompts)] for i in range(32)])
    after = number_share(trainer, prompts, seed=1)
    assert after - before >= 0.30, (before, after)


def test_reward_sources(trained_project):
    tokenizer = load_tokenizer(trained_project / "artifacts" / "tokenizer")
    rm = trained_project / "artifacts" / "rm" / "model.pt"
    device = torch.device("cpu")
    prompts, answers = ["Greet Bob.", "What is 2 plus 3?"], ["Hello, Bob!", "2 + 3 = 5."]
    rule = make_scorer("rule:contains_number", tokenizer, device, rm)
    assert rule(prompts, answers).tolist() == [0.0, 1.0]
    gold = make_scorer("rule:gold", tokenizer, device, rm)
    assert gold(prompts, answers).tolist() == [1.0, 1.0]
    single = make_scorer("rm", tokenizer, device, rm)(prompts, answers)
    ensemble = make_scorer("ensemble", tokenizer, device, rm, ensemble=[rm], reduce="mean")
    torch.testing.assert_close(ensemble(prompts, answers), single)
    model, payload = checkpoint.load_model(rm, tokenizer)
    raw = score(model, tokenizer, prompts, answers, pooling=payload["pooling"])
    torch.testing.assert_close(single, raw / payload["reward_std"])  # normalized by the std
