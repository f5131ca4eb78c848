import csv
import dataclasses
import json
import shutil
import sys
import time

import pytest
import torch

from rlhf.algorithms.reward_model import score
from rlhf.algorithms.rl.registry import ALGORITHMS
from rlhf.algorithms.rl.trainer import RLTrainer
from rlhf.algorithms.rules import contains_number
from rlhf.algorithms.scorers import RuleScorer, ScoringContext, build
from rlhf.algorithms.transformers_scorer import TransformersRewardScorer
from rlhf.data.schemas import PROMPT_SCHEMA, read_rows
from rlhf.errors import CheckpointError, PipelineError
from rlhf.eval.policies import sample_policy
from rlhf.models import checkpoint
from rlhf.models.gpt import GPT
from rlhf.models.lora import adapters, adapters_off, add_adapters, merged_model
from rlhf.params import Params, ParamsError
from rlhf.params.groups import RL_ALGORITHMS, CriticParams, DataParams, RLParams
from rlhf.project.metric_files import read_metrics
from rlhf.reward_sources import ENSEMBLE, parse
from rlhf.synthetic.datasets import synthetic_sets
from rlhf.tokenizer.tokenizer import load_tokenizer
from rlhf.train.curves import read_curve

from conftest import curves, kill_at_first_save, make_project, run_module, write_params

MISMATCH = {"logprob_mismatch", "logprob_mismatch_max"}
RL_KEYS = {"score", "kl", "steps", "gold_sampled", "win_rate_vs_sft"} | MISMATCH
STEP_COLUMNS = {
    "score", "non_score_reward", "kl", "beta", "approx_kl", "clip_fraction", "entropy",
    "response_length", "end_token_rate", *MISMATCH,
}  # fmt: skip
CRITIC_COLUMNS = {"value_loss", "value_clip_fraction", "explained_variance"}
TIMING = {"rollout_tokens_per_s", "update_tokens_per_s", "rollout_s", "scoring_s", "update_s"}
TIMING_SUMMARY = {
    "threads", "processes", "cpu", "rollout_tokens_per_s", "update_tokens_per_s",
    "seconds_rollout", "seconds_scoring", "seconds_update",
}  # fmt: skip


def rl_metrics(project, algorithm="ppo"):
    return read_metrics(algorithm, project)


def rl_curve(project, metric, algorithm="ppo"):
    return read_curve(project / "dvclive" / algorithm / "plots" / "metrics", metric)


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_each_algorithm_writes_its_own_outputs(trained_project, algorithm):
    metrics = rl_metrics(trained_project, algorithm)
    assert set(metrics) >= RL_KEYS | {"kl_to_sft", "gold_sampled_sft"}
    assert metrics["steps"] == 4 and set(metrics["win_rate_vs_sft"]) == {"gold", "rm"}
    # the sampler's log-probs are the scoring pass's (the ratios' denominators) up to float32
    # rounding, every step: the mean within 1e-6 (measured 2e-7 to 3e-7), the largest within
    # four steps of float32 at log-probs down to -16, 4 * 2**-20 (measured 1 to 2.5 steps)
    means = [v for _, v in rl_curve(trained_project, "logprob_mismatch", algorithm)]
    largest = [v for _, v in rl_curve(trained_project, "logprob_mismatch_max", algorithm)]
    assert max(means) <= 1e-6 and max(largest) <= 4 * 2**-20
    assert 0 <= metrics["logprob_mismatch"] <= metrics["logprob_mismatch_max"]
    for judge, rate in metrics["win_rate_vs_sft"].items():  # by gold and by its reward source
        ci = metrics["win_rate_vs_sft_ci95"][judge]
        assert 0.0 <= ci["low"] <= rate <= ci["high"] <= 1.0
    logged = set(curves(trained_project, algorithm))  # one dvclive TSV per statistic
    assert [step for step, _ in rl_curve(trained_project, "score", algorithm)] == [1, 2, 3, 4]
    critic = CRITIC_COLUMNS if algorithm == "ppo" else {"kl_loss"}
    assert logged >= STEP_COLUMNS | critic
    assert not logged & TIMING and not set(metrics) & TIMING_SUMMARY
    timings = json.loads((trained_project / "timings" / f"{algorithm}.json").read_text())
    assert set(timings) == TIMING_SUMMARY and timings["rollout_tokens_per_s"] > 0
    with open(trained_project / "timings" / f"{algorithm}_steps.csv") as f:
        timed = list(csv.DictReader(f))
    assert [int(r["step"]) for r in timed] == [1, 2, 3, 4] and set(timed[0]) == {"step"} | TIMING
    assert (algorithm == "ppo") == ("ptx_loss" in logged)  # ptx_coef is set for ppo only
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
    assert not (project / "metrics" / "details" / "ppo.json").exists()
    killed_at = checkpoint.load(resume)["trainer"]["step"]

    rerun = run_module("rlhf.stages.rl", project, "ppo")
    assert f"resuming from iteration {killed_at}" in rerun.stderr
    assert rl_metrics(project) == rl_metrics(trained_project)
    assert curves(project, "ppo") == curves(trained_project, "ppo")  # each iteration once
    assert not (project / ".rlhf" / "live" / "ppo").exists()
    # the snapshot taken before the kill is published, identical to the uninterrupted one
    snapshot = "artifacts/ppo/snapshots/step_00002.pt"
    resumed_weights = checkpoint.load(project / snapshot)["model"]
    for name, tensor in checkpoint.load(trained_project / snapshot)["model"].items():
        assert torch.equal(resumed_weights[name], tensor), name


def trainer_for(
    trained_project, algorithm: str, overrides: dict, *, dropout: float = 0.0, lora: int = 0,
    microbatch_tokens: int = 16384, shared: dict | None = None,
):  # fmt: skip
    """A trainer for `algorithm` on the tiny project's SFT policy (and its RM as critic);
    `lora` > 0 trains adapters of that rank on both, the policy its own reference. Seeded:
    the adapters' initialization draws from the global generator, which earlier tests move."""
    torch.manual_seed(0)
    tokenizer = load_tokenizer(trained_project / "artifacts" / "tokenizer")
    sft = trained_project / "artifacts" / "sft" / "model.pt"
    cfg = ALGORITHMS[algorithm].params(**overrides)
    policy, reference = (checkpoint.load_model(sft, tokenizer)[0] for _ in range(2))
    if dropout:
        policy = GPT(dataclasses.replace(policy.config, dropout=dropout))
        policy.load_state_dict(checkpoint.load(sft)["model"])
    critic = None
    if isinstance(cfg, CriticParams) and cfg.critic == "separate":
        rm = trained_project / "artifacts" / "rm" / "model.pt"
        critic = checkpoint.load_model(rm, tokenizer)[0]
        critic.init_value_head_from_reward_head()
    if lora:
        reference = None
        for model in (policy, critic):
            if model is not None:
                add_adapters(model, lora, alpha=16.0)
    rows = read_rows(trained_project / "data" / "prepared" / "prompts_train.parquet", PROMPT_SCHEMA)
    return RLTrainer(
        ALGORITHMS[algorithm], cfg,
        RLParams(max_new_tokens=12, microbatch_tokens=microbatch_tokens, **(shared or {})),
        policy=policy,
        reference=reference, critic=critic, scorer=RuleScorer(contains_number),
        tokenizer=tokenizer, prompts=sorted({r["prompt"] for r in rows}), seed=0,
    )  # fmt: skip


def number_share(trainer) -> float:
    samples = sample_policy(
        trainer.policy, trainer.tokenizer, trainer.prompts, n=2,
        config=trainer.experience.sampling, seed=1, batch_size=128,
    )  # fmt: skip
    return sum(contains_number("", r) for r in samples.responses) / len(samples.responses)


# the same budget for every algorithm: 30 iterations of 32 answers
LEARNS = {
    "ppo": {"batch_size": 32, "update_epochs": 2},
    "reinforce": {"batch_size": 32},
    "rloo": {"batch_size": 8, "group_size": 4},
    "grpo": {"batch_size": 8, "group_size": 4, "update_epochs": 2},
}


def assert_learns_numbers(trainer, name: str) -> None:
    """30 iterations raise the share of answers with a number by 30 points at least."""
    before = number_share(trainer)
    for _ in range(30):
        trainer.iteration()
    after = number_share(trainer)
    print(f"{name}: answers with a number {before:.3f} -> {after:.3f}")
    assert after - before >= 0.30, (before, after)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_learns_the_rule_reward_contains_number(trained_project, algorithm):
    """The learning signal is real: a rule reward moves what each algorithm's policy says."""
    overrides = {"steps": 30, "minibatch_size": 16, "lr": 2e-3, "kl_coef": 0.01}
    trainer = trainer_for(trained_project, algorithm, overrides | LEARNS[algorithm])
    assert_learns_numbers(trainer, algorithm)


def test_lora_ppo_learns_the_rule_reward_on_one_copy_of_the_base(trained_project):
    """Rank-8 adapters on the policy and on the critic, the reference being the policy with
    its adapters off (no second copy): the same budget as full PPO, a larger learning rate
    (measured 0.275 -> 0.9 to 0.97 over three seeds). The merged model gives the adapted
    model's logits: within 1e-5 in float64, where only the algebra counts, and in float32
    within its rounding of logits near 10 (measured 3e-6 to 5e-6)."""
    overrides = {"steps": 30, "minibatch_size": 16, "lr": 1e-2, "kl_coef": 0.01}
    trainer = trainer_for(trained_project, "ppo", overrides | LEARNS["ppo"], lora=8)
    assert trainer.reference is None
    assert_learns_numbers(trainer, "lora ppo")
    policy, ids = trainer.policy, torch.randint(0, 400, (4, 24), generator=torch.Generator())
    with torch.no_grad():
        sft = checkpoint.load_model(trained_project / "artifacts" / "sft" / "model.pt")[0]
        with adapters_off(policy):
            assert torch.equal(policy(ids), sft(ids))  # the base weights never moved
        torch.testing.assert_close(merged_model(policy)(ids), policy(ids), atol=1e-5, rtol=1e-5)
        policy.double()
        torch.testing.assert_close(merged_model(policy)(ids), policy(ids), atol=1e-5, rtol=0)


def test_a_lora_rl_stage_writes_a_merged_policy(trained_project, tmp_path):
    project = project_ready_for_rl(trained_project, tmp_path / "p")
    write_params(project, {"rl.lora_rank": 4, "ppo.lr": 1e-2})
    run_module("rlhf.stages.rl", project, "ppo")
    model, _ = checkpoint.load_model(project / "artifacts" / "ppo" / "model.pt")
    assert not adapters(model)  # an ordinary checkpoint: the adapters merged in
    sft = checkpoint.load(trained_project / "artifacts" / "sft" / "model.pt")["model"]
    moved = [k for k, v in model.state_dict().items() if not torch.equal(v, sft[k])]
    assert moved and all(k.startswith(("blocks.", "value_head.")) for k in moved)
    assert rl_metrics(project)["kl_to_sft"] > 0


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


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_microbatches_add_up_to_the_minibatch(trained_project, algorithm):
    """A token budget (40) that runs each of the scoring pass's rows and each minibatch's as
    a pass of its own, gradients added up before the minibatch's one step: two iterations
    give the statistics and the policy of one pass per minibatch, up to summation order."""
    overrides = {"batch_size": 8, "minibatch_size": 4, "update_epochs": 2, "lr": 1e-3}
    if algorithm == "grpo":
        overrides |= {"batch_size": 2, "group_size": 4}
    runs = [
        trainer_for(trained_project, algorithm, overrides, microbatch_tokens=budget)
        for budget in (16384, 40)
    ]
    for _ in range(2):
        whole, cut = (trainer.iteration()[0] for trainer in runs)
        assert cut.keys() == whole.keys()
        for key in whole.keys() - {"update_tokens_per_s", "rollout_tokens_per_s"} - MISMATCH:
            if not key.endswith("_s"):  # times; and the mismatch is rounding itself
                assert cut[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-6), key
    ids = torch.randint(0, 400, (4, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the models, not their weights: Adam turns the rounding noise of
        # the key bias's gradient (zero in exact arithmetic) into steps either way
        logits = [trainer.policy(ids) for trainer in runs]
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=0)


def test_the_reward_is_the_score_shaped_by_the_rl_params(trained_project):
    """`rl.missing_eos_penalty` for answers cut off at max_new_tokens, `rl.length_penalty` per
    token, then `rl.reward_clip`: the reward of every answer, from its score, end and length."""
    shaping = {"missing_eos_penalty": 0.7, "length_penalty": 0.05, "reward_clip": 0.5}
    trainer = trainer_for(trained_project, "ppo", {"batch_size": 16}, shared=shaping)
    experience, stats = trainer.experience.make(trainer.prompts[:16], trainer.kl_ctl.beta)
    rollout = experience.rollout
    assert 0 < int(rollout.ended.sum()) < 16  # some answers end, some are cut off
    shaped = experience.scores - 0.7 * (~rollout.ended).float() - 0.05 * rollout.lengths.float()
    expected = shaped.clamp(-0.5, 0.5)
    assert (shaped.abs() > 0.5).any()  # the clip bites
    assert stats["reward"] == pytest.approx(float(expected.mean()), abs=1e-6)
    assert stats["score"] == pytest.approx(float(experience.scores.mean()), abs=1e-6)


def test_ppo_stops_its_passes_at_the_target_approx_kl(trained_project):
    """`ppo.target_approx_kl`: passes over the rollout end once a pass's mean approx-KL is
    above it (one pass at a target below any KL), all `update_epochs` without a target."""
    ran = []
    for target in (1e-12, 0.0):
        cfg = {"batch_size": 8, "minibatch_size": 4, "update_epochs": 4, "target_approx_kl": target}
        stats, _ = trainer_for(trained_project, "ppo", cfg).iteration()
        ran.append(stats["update_epochs_run"])
    assert ran == [1, 4]


def test_the_entropy_bonus_changes_the_update(trained_project):
    """`entropy_coef` > 0 adds the bonus to the loss (at 0 the entropy is only logged): from
    the same rollout, the updated weights differ."""
    weights = []
    for coef in (0.0, 0.5):
        trainer = trainer_for(trained_project, "ppo", {"batch_size": 8, "entropy_coef": coef})
        stats, _ = trainer.iteration()
        assert stats["entropy"] > 0
        weights.append(torch.cat([p.detach().flatten() for p in trainer.policy.parameters()]))
    assert not torch.equal(weights[0], weights[1])


def test_an_adaptive_kl_coefficient_follows_the_measured_kl(trained_project):
    """`kl_target` through the trainer: after each iteration beta is multiplied by
    1 + clip(KL / target - 1, -0.2, 0.2) * answers / kl_horizon (Ziegler et al.) with the KL
    the iteration logged, and the next iteration's penalty uses it; 0 keeps `kl_coef`."""
    for target in (0.05, 0.0):
        cfg = {"batch_size": 8, "kl_coef": 0.2, "kl_target": target, "kl_horizon": 100}
        trainer = trainer_for(trained_project, "ppo", cfg | {"lr": 1e-3})
        expected = 0.2
        for _ in range(3):
            stats, _ = trainer.iteration()
            assert stats["beta"] == pytest.approx(expected)  # the beta this iteration used
            if target:
                expected *= 1 + min(max(stats["kl"] / target - 1, -0.2), 0.2) * 8 / 100
        assert trainer.kl_ctl.beta == pytest.approx(expected)
        assert (expected != 0.2) == bool(target)


def test_a_shared_critic_is_a_value_head_trained_on_the_policy(trained_project):
    """`ppo.critic: shared`: no critic model; the values come from a head on the policy's
    trunk, which the update trains along with the policy (`vf_coef`)."""
    trainer = trainer_for(trained_project, "ppo", {"batch_size": 8, "critic": "shared"})
    assert trainer.critic is None and trainer.critic_opt is None
    head = trainer.policy.value_head.weight.detach().clone()
    stats, experience = trainer.iteration()
    assert experience.values is not None and stats["value_loss"] > 0
    assert not torch.equal(trainer.policy.value_head.weight, head)


def reward_source(spelled: str, tokenizer, device, rm, **context):
    """The scorer `rl.reward: spelled` builds."""
    return build(parse(spelled, "rl.reward"), ScoringContext(tokenizer, device, rm, **context))


def test_reward_sources(trained_project, tmp_path):
    tokenizer = load_tokenizer(trained_project / "artifacts" / "tokenizer")
    rm = trained_project / "artifacts" / "rm" / "model.pt"
    device = torch.device("cpu")
    prompts, answers = ["Greet Bob.", "What is 2 plus 3?"], ["Hello, Bob!", "2 + 3 = 5."]
    rule = reward_source("rule:contains_number", tokenizer, device, rm)
    assert rule(prompts, answers).tolist() == [0.0, 1.0]
    gold = reward_source("rule:gold", tokenizer, device, rm)
    assert gold(prompts, answers).tolist() == [1.0, 1.0]
    single = reward_source("rm", tokenizer, device, rm)(prompts, answers)
    # the RM with its mirror image (rewards negated) as the ensemble: the default `min` takes
    # the lower of each pair, `mean` cancels them
    payload = torch.load(rm, weights_only=True)
    for key in ("reward_head.weight", "reward_head.bias"):
        payload["model"][key] = -payload["model"][key]
    mirrored = tmp_path / "mirrored.pt"
    torch.save(payload, mirrored)
    ensemble = [parse(f"rm:{mirrored}", ENSEMBLE)]
    lowest = reward_source("ensemble", tokenizer, device, rm, ensemble=ensemble)
    torch.testing.assert_close(lowest(prompts, answers), -single.abs())
    mean = reward_source(
        "ensemble", tokenizer, device, rm, ensemble=ensemble, ensemble_reduce="mean"
    )
    torch.testing.assert_close(mean(prompts, answers), torch.zeros_like(single), atol=1e-6, rtol=0)
    weighted = {"ensemble_reduce": "weighted_sum", "ensemble_weights": (3.0, 2.0)}
    summed = reward_source("ensemble", tokenizer, device, rm, ensemble=ensemble, **weighted)
    torch.testing.assert_close(summed(prompts, answers), single)  # 3 r - 2 r
    model, payload = checkpoint.load_model(rm, tokenizer)
    raw = score(model, tokenizer, prompts, answers, pooling=payload["pooling"])
    torch.testing.assert_close(single, raw / payload["reward_std"])  # normalized by the std
    with pytest.raises(ParamsError, match=r"'rule:nope' names no rule.*'rule:contains_n"):
        reward_source("rule:nope", tokenizer, device, rm)


def deberta_folder(folder, num_labels: int = 1):
    """A tiny random DeBERTa-v2 reward model with its own WordPiece tokenizer that reads
    (prompt, response) as a segment pair, as `save_pretrained` writes them: a family we have no
    backbone for, so it scores through transformers."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rows = synthetic_sets(DataParams(n_train=200), seed=3)["train"]
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.pre_tokenizer, wordpiece.decoder = (
        pre_tokenizers.BertPreTokenizer(),
        decoders.WordPiece(),
    )
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    wordpiece.train_from_iterator(
        [text for row in rows for text in (row["prompt"], row["response"])],
        trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials),
    )
    ends = [(t, wordpiece.token_to_id(t)) for t in ("[CLS]", "[SEP]")]
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=ends
    )
    torch.manual_seed(0)
    model = transformers.DebertaV2ForSequenceClassification(transformers.DebertaV2Config(
        vocab_size=wordpiece.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
        num_labels=num_labels, pad_token_id=0, initializer_range=0.5,
    ))  # fmt: skip
    model.save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=wordpiece, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
        unk_token="[UNK]", model_max_length=128,
    ).save_pretrained(folder)  # fmt: skip
    return folder, model.eval()


@pytest.fixture(scope="module")
def deberta(tmp_path_factory):
    return deberta_folder(tmp_path_factory.mktemp("deberta"))


def test_a_reward_model_of_another_family_scores_through_transformers(deberta, trained_project):
    """`hf:DIR` on a DeBERTa folder: padded batches score each (prompt, response) pair as the
    model does alone, through its own tokenizer; PPO trains on those scores."""
    folder, model = deberta
    tokenizer = load_tokenizer(trained_project / "artifacts" / "tokenizer")
    rm = trained_project / "artifacts" / "rm" / "model.pt"
    scorer = reward_source(f"hf:{folder}", tokenizer, torch.device("cpu"), rm)
    assert isinstance(scorer, TransformersRewardScorer)
    prompts = ["What is 2 plus 3?", "Greet Bob.", "Repeat: a b c"]
    answers = ["2 + 3 = 5.", "Hello, Bob! Nice to meet you today, my friend.", "a b c"]
    alone = [
        model(**scorer.tokenizer(p, a, return_tensors="pt")).logits[0, 0].item()
        for p, a in zip(prompts, answers, strict=True)
    ]
    scorer.batch_size = 2  # a full batch and a short one
    scores = scorer(prompts, answers)
    torch.testing.assert_close(scores, torch.tensor(alone), rtol=0, atol=1e-5)
    assert scores.std() > 0.01  # distinct scores, not a constant

    trainer = trainer_for(trained_project, "ppo", {"batch_size": 8, "minibatch_size": 8})
    trainer.experience.scorer = scorer
    for _ in range(2):
        _, experience = trainer.iteration()
    rollout = experience.rollout
    torch.testing.assert_close(experience.scores, scorer(rollout.prompts, rollout.responses))
    assert trainer.step == 2


def test_a_chat_reward_model_reads_conversations_through_its_template(deberta, tmp_path):
    folder, model = deberta
    chat = shutil.copytree(folder, tmp_path / "chat")
    config = json.loads((chat / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}{{ '[CLS] ' + m['role'] + ': ' + m['content'] + ' [SEP]' }}"
        "{% endfor %}"
    )
    (chat / "tokenizer_config.json").write_text(json.dumps(config))
    scorer = TransformersRewardScorer.load(chat, "deberta-v2", torch.device("cpu"))
    batch = scorer.encode(["Greet Bob."], ["Hello, Bob!"])
    ids = batch["input_ids"][0].tolist()
    text = "[CLS] user: Greet Bob. [SEP][CLS] assistant: Hello, Bob! [SEP]"
    assert ids == scorer.tokenizer(text, add_special_tokens=False)["input_ids"]
    torch.testing.assert_close(scorer(["Greet Bob."], ["Hello, Bob!"]), model(**batch).logits[:, 0])


def test_a_chat_reward_model_whose_template_hangs_is_refused_at_load(deberta, tmp_path):
    """transformers renders the template in this process, unbounded: the sandbox tries it
    first, so a template that loops for hours is one error naming the folder, in seconds."""
    folder, _ = deberta
    chat = shutil.copytree(folder, tmp_path / "looping")
    config = json.loads((chat / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    )
    (chat / "tokenizer_config.json").write_text(json.dumps(config))
    start = time.monotonic()
    with pytest.raises(CheckpointError, match=r"looping: its chat template cannot be used: "
                       r"rendering it takes longer than 5 s"):  # fmt: skip
        TransformersRewardScorer.load(chat, "deberta-v2", torch.device("cpu"))
    assert time.monotonic() - start < 10


def test_a_reward_model_of_another_family_with_a_hostile_weights_header_is_refused(
    deberta, tmp_path
):
    """transformers reads a safetensors header unchecked (a traceback, or terabytes claimed):
    the header and the file's bytes are checked first, one error naming the file."""
    folder, _ = deberta
    weights = shutil.copytree(folder, tmp_path / "hostile") / "model.safetensors"
    weights.write_bytes((2**63).to_bytes(8, "little") + weights.read_bytes()[8:])
    with pytest.raises(CheckpointError, match=r"hostile/model.safetensors: not a safetensors"):
        TransformersRewardScorer.load(weights.parent, "deberta-v2", torch.device("cpu"))


def test_an_external_reward_model_names_what_it_lacks(tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    folder, _ = deberta_folder(tmp_path / "two-labels", num_labels=2)
    with pytest.raises(CheckpointError, match=r"two-labels: a reward model has one output.*2"):
        reward_source(f"hf:{folder}", None, cpu, "unused.pt")
    with pytest.raises(CheckpointError, match=r"nowhere: no config.json"):
        reward_source(f"hf:{tmp_path / 'nowhere'}", None, cpu, "unused.pt")
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if the extra were missing
    with pytest.raises(PipelineError, match=r"two-labels: its 'deberta-v2' reward model .*\[hf\]"):
        reward_source(f"hf:{folder}", None, cpu, "unused.pt")


def test_the_registry_and_the_params_groups_agree():
    """Adding an algorithm is one registry entry plus its params group of the same name."""
    params = Params()
    assert tuple(ALGORITHMS) == RL_ALGORITHMS
    for name, algorithm in ALGORITHMS.items():
        assert type(params.algorithm(name)) is algorithm.params
