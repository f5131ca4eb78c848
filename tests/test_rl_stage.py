import csv
import dataclasses
import json
import shutil

import pytest
import torch

from rlhf.algorithms.reward_model import score
from rlhf.algorithms.rl.registry import ALGORITHMS
from rlhf.algorithms.rl.trainer import RLTrainer
from rlhf.algorithms.rules import contains_number
from rlhf.algorithms.scorers import RuleScorer, make_scorer
from rlhf.data.schemas import PROMPT_SCHEMA, read_rows
from rlhf.data.tokenizer import load_tokenizer
from rlhf.eval.policies import sample_policy
from rlhf.models import checkpoint
from rlhf.models.gpt import GPT
from rlhf.params import RL_ALGORITHMS, CriticParams, Params, ParamsError, RLParams

from conftest import kill_at_first_save, make_project, run_module

RL_KEYS = {"score", "kl", "steps", "rollout_tokens_per_s", "gold_sampled", "win_rate_vs_sft"}
STEP_COLUMNS = {
    "score", "non_score_reward", "kl", "beta", "approx_kl", "clip_fraction", "entropy",
    "response_length", "end_token_rate", "rollout_tokens_per_s", "update_tokens_per_s",
    "rollout_s", "scoring_s", "update_s",
}  # fmt: skip
CRITIC_COLUMNS = {"value_loss", "value_clip_fraction", "explained_variance"}
TIMING = {"rollout_tokens_per_s", "update_tokens_per_s", "rollout_s", "scoring_s", "update_s"}


def rl_metrics(project, algorithm="ppo"):
    return json.loads((project / "metrics" / f"{algorithm}.json").read_text())


def rl_steps(project, algorithm="ppo"):
    with open(project / "metrics" / f"{algorithm}_steps.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_each_algorithm_writes_its_own_outputs(trained_project, algorithm):
    metrics = rl_metrics(trained_project, algorithm)
    assert set(metrics) >= RL_KEYS | {"kl_to_sft", "gold_sampled_sft"}
    assert metrics["steps"] == 4 and 0.0 <= metrics["win_rate_vs_sft"] <= 1.0
    steps = rl_steps(trained_project, algorithm)
    assert [int(r["step"]) for r in steps] == [1, 2, 3, 4]
    critic = CRITIC_COLUMNS if algorithm == "ppo" else {"kl_loss"}
    assert set(steps[0]) >= STEP_COLUMNS | critic
    assert (algorithm == "ppo") == ("ptx_loss" in steps[0])  # ptx_coef is set for ppo only
    folder = trained_project / "artifacts" / algorithm
    samples = (folder / "samples.jsonl").read_text().splitlines()
    assert {json.loads(s)["step"] for s in samples} == {1, 2, 4}
    payload = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
    assert payload["kind"] == "policy" and payload["step"] == 4 and payload["algo"] == algorithm
    assert payload["backbone"] == "gpt"
    snapshots = folder / "snapshots"
    assert sorted(p.name for p in snapshots.iterdir()) == ["step_00002.pt"]  # not the last step
    assert not (trained_project / ".rlhf" / "resume" / f"{algorithm}.pt").exists()
    assert not (trained_project / ".rlhf" / "resume" / f"{algorithm}_snapshots").exists()


def project_ready_for_rl(trained_project, directory):
    project = make_project(directory)
    shutil.copytree(trained_project / "data" / "prepared", project / "data" / "prepared")
    for name in ("tokenizer", "sft", "rm"):
        shutil.copytree(trained_project / "artifacts" / name, project / "artifacts" / name)
    return project


def test_killed_ppo_resumes_and_matches_an_uninterrupted_run(trained_project, tmp_path):
    project = project_ready_for_rl(trained_project, tmp_path / "p")
    resume = kill_at_first_save(
        project, "rlhf.stages.rl", project / ".rlhf" / "resume" / "ppo.pt", "ppo"
    )
    assert not (project / "metrics" / "ppo.json").exists()
    killed_at = checkpoint.load(resume)["trainer"]["step"]

    rerun = run_module("rlhf.stages.rl", project, "ppo")
    assert f"resuming from iteration {killed_at}" in rerun.stderr
    resumed, uninterrupted = rl_metrics(project), rl_metrics(trained_project)
    for metrics in (resumed, uninterrupted):
        for key in [k for k in metrics if k.startswith("seconds_") or k in TIMING]:
            metrics.pop(key)
    assert resumed == uninterrupted
    strip = [{k: v for k, v in r.items() if k not in TIMING} for r in rl_steps(project)]
    assert strip == [
        {k: v for k, v in r.items() if k not in TIMING} for r in rl_steps(trained_project)
    ]
    # the snapshot taken before the kill is published, identical to the uninterrupted one
    snapshot = "artifacts/ppo/snapshots/step_00002.pt"
    resumed_weights = checkpoint.load(project / snapshot)["model"]
    for name, tensor in checkpoint.load(trained_project / snapshot)["model"].items():
        assert torch.equal(resumed_weights[name], tensor), name


def trainer_for(trained_project, algorithm: str, overrides: dict, *, dropout: float = 0.0):
    """A trainer for `algorithm` on the tiny project's SFT policy (and its RM as critic)."""
    tokenizer = load_tokenizer(trained_project / "artifacts" / "tokenizer")
    sft = trained_project / "artifacts" / "sft" / "model.pt"
    cfg = ALGORITHMS[algorithm].params(**overrides)
    policy, reference = (checkpoint.load_model(sft, tokenizer)[0] for _ in range(2))
    if dropout:
        policy = GPT(dataclasses.replace(policy.config, dropout=dropout))
        policy.load_state_dict(checkpoint.load(sft)["model"])
    critic = None
    if isinstance(cfg, CriticParams):
        rm = trained_project / "artifacts" / "rm" / "model.pt"
        critic = checkpoint.load_model(rm, tokenizer)[0]
        critic.init_value_head_from_reward_head()
    rows = read_rows(trained_project / "data" / "prepared" / "prompts_train.parquet", PROMPT_SCHEMA)
    return RLTrainer(
        ALGORITHMS[algorithm], cfg, RLParams(max_new_tokens=12), policy=policy,
        reference=reference, critic=critic, scorer=RuleScorer(contains_number),
        tokenizer=tokenizer, prompts=sorted({r["prompt"] for r in rows}), seed=0,
    )  # fmt: skip


def number_share(trainer) -> float:
    samples = sample_policy(
        trainer.policy, trainer.tokenizer, trainer.prompts, n=2, config=trainer.sampling, seed=1,
        batch_size=128,
    )  # fmt: skip
    return sum(contains_number("", r) for r in samples.responses) / len(samples.responses)


# the same budget for every algorithm: 30 iterations of 32 answers
LEARNS = {
    "ppo": {"batch_size": 32, "update_epochs": 2},
    "reinforce": {"batch_size": 32},
    "rloo": {"batch_size": 8, "group_size": 4},
    "grpo": {"batch_size": 8, "group_size": 4, "update_epochs": 2},
}


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_learns_the_rule_reward_contains_number(trained_project, algorithm):
    """The learning signal is real: a rule reward moves what each algorithm's policy says."""
    overrides = {"steps": 30, "minibatch_size": 16, "lr": 2e-3, "kl_coef": 0.01}
    trainer = trainer_for(trained_project, algorithm, overrides | LEARNS[algorithm])
    before = number_share(trainer)
    for _ in range(30):
        trainer.iteration()
    after = number_share(trainer)
    print(f"{algorithm}: answers with a number {before:.3f} -> {after:.3f}")
    assert after - before >= 0.30, (before, after)


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_updates_run_without_dropout_so_the_first_ratio_is_one(trained_project, algorithm):
    """With dropout 0.1 in the policy, the first minibatch of an update sees the very policy
    that sampled the rollout: ratio 1 up to float rounding (the minibatch packs its rows into
    other bins than the rollout's forward did), where dropout left a max |log-ratio| of 0.6."""
    one_minibatch = {"batch_size": 8, "minibatch_size": 32, "update_epochs": 1, "lr": 1e-3}
    if algorithm == "grpo":
        one_minibatch |= {"group_size": 4}
    trainer = trainer_for(trained_project, algorithm, one_minibatch, dropout=0.1)
    stats, _ = trainer.iteration()
    assert stats["approx_kl"] < 1e-12 and stats["clip_fraction"] == 0.0
    assert not trainer.policy.training


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
    with pytest.raises(ParamsError, match=r"rl.reward = 'rule:nope'.*'rule:contains_number'"):
        make_scorer("rule:nope", tokenizer, device, rm)


def test_the_registry_and_the_params_groups_agree():
    """Adding an algorithm is one registry entry plus its params group of the same name."""
    params = Params()
    assert tuple(ALGORITHMS) == RL_ALGORITHMS
    for name, algorithm in ALGORITHMS.items():
        assert type(params.algorithm(name)) is algorithm.params
