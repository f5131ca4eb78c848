"""The RL trainer's wiring, through its own code paths on tiny random models: each test fails
when a sign, a normalization or a saved value is wrong in the trainer, where the math tests of
each piece (test_advantages.py, test_losses.py, test_kl.py beside this file) would still
pass."""

import pytest
import torch

from rlhf.algorithms.rl.losses import masked_mean, masked_var
from rlhf.algorithms.rl.registry import ALGORITHMS
from rlhf.algorithms.rl.trainer import RLTrainer
from rlhf.algorithms.rules import contains_number
from rlhf.algorithms.scorers import RuleScorer
from rlhf.models import checkpoint
from rlhf.params.groups import CriticParams, RLParams
from rlhf.tokenizer.tokenizer import save_tokenizer

from conftest import tiny_gpt

PROMPTS = [f"What is {a} plus {a + 2}?" for a in range(8)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("tok"), "bytes")


def tiny_trainer(tokenizer, algorithm: str, rule=contains_number, **overrides) -> RLTrainer:
    """`algorithm` with its params `overrides` on a random policy whose reference is another
    random model, so that the KL between them is not 0 from the first rollout; `rule` scores
    each answer, and the reward is that score (no penalty for a missing end token)."""
    entry = ALGORITHMS[algorithm]
    cfg = entry.params(**overrides)
    critic = tiny_gpt(tokenizer, 2) if isinstance(cfg, CriticParams) else None
    return RLTrainer(
        entry, cfg, RLParams(max_new_tokens=8, missing_eos_penalty=0.0),
        policy=tiny_gpt(tokenizer, 0), reference=tiny_gpt(tokenizer, 1), critic=critic,
        scorer=RuleScorer(rule), tokenizer=tokenizer, prompts=PROMPTS, seed=0,
    )  # fmt: skip


@pytest.fixture(scope="module")
def ppo_experience(tokenizer):
    """A PPO rollout of every prompt with beta 0.5 and lambda 1, so that GAE's returns are
    each token's rewards to go."""
    trainer = tiny_trainer(tokenizer, "ppo", batch_size=8, kl_coef=0.5, lam=1.0)
    experience, _ = trainer.experience.make(PROMPTS, trainer.kl_ctl.beta)
    return experience


def test_each_answers_return_is_its_score_minus_beta_times_its_kl(ppo_experience):
    """InstructGPT's per-token reward is the score less beta * KL(policy || reference): the
    return from an answer's first token, which the critic regresses on, is its score minus
    0.5 times the k1 KL summed over its tokens. A penalty of the wrong sign pays the policy
    for drifting from the reference."""
    experience = ppo_experience
    mask = experience.rollout.response_mask
    kl = torch.where(mask, experience.old_logprobs - experience.ref_logprobs, 0.0).sum(-1)
    assert kl.abs().max() > 0.1  # a penalty whose sign shows
    torch.testing.assert_close(experience.returns[:, 0], experience.scores - 0.5 * kl)


def test_ppo_advantages_are_whitened_over_the_rollout(ppo_experience):
    """PPO's advantages have mean 0 and variance 1 over the rollout's response tokens (0 on
    padding): unwhitened, their scale would follow the reward's and the critic's, and the
    clipped step's size with it."""
    advantages, mask = ppo_experience.advantages, ppo_experience.rollout.response_mask
    assert not mask.all()  # some answers end early: padding is left out of the statistics
    assert float(masked_mean(advantages, mask)) == pytest.approx(0.0, abs=1e-6)
    assert float(masked_var(advantages, mask)) == pytest.approx(1.0, abs=1e-5)
    assert (advantages[~mask] == 0).all()


def test_the_entropy_bonus_raises_the_policys_entropy(tokenizer):
    """`entropy_coef` is subtracted from the loss: with every answer scored alike and no KL
    penalty, RLOO's advantages are all 0 and the bonus alone moves the policy, so a second
    update on the same rollout measures a higher entropy than the first did."""
    trainer = tiny_trainer(
        tokenizer, "rloo", rule=lambda prompt, answer: 0.0, batch_size=4, group_size=2,
        minibatch_size=8, lr=1e-2, kl_coef=0.0, entropy_coef=0.1,
    )  # fmt: skip
    experience, _ = trainer.experience.make(PROMPTS[:4], trainer.kl_ctl.beta)
    assert (experience.advantages == 0).all()
    before, after = (trainer.update(experience)["entropy"] for _ in range(2))
    assert after > before


def test_a_resumed_run_keeps_the_adapted_kl_coefficient(tokenizer, tmp_path):
    """The adaptive KL controller's beta is part of the resume state: a run saved after its
    first iteration (as the RL stage saves it, a checkpoint) and resumed by a fresh trainer
    penalizes its second with the beta of the uninterrupted run, and ends with its beta.
    The tiny models' KL is far below the target of 10 nats, so each iteration shrinks beta by
    0.2 * 8 answers / 10: a resumed run that started over from `kl_coef` would differ."""
    adaptive = {
        "batch_size": 4,
        "group_size": 2,
        "kl_coef": 0.2,
        "kl_target": 10.0,
        "kl_horizon": 10,
    }
    uninterrupted = tiny_trainer(tokenizer, "rloo", **adaptive)
    used_betas = [uninterrupted.iteration()[0]["beta"] for _ in range(2)]
    assert used_betas == [0.2, pytest.approx(0.2 * (1 - 0.2 * 8 / 10))]

    interrupted = tiny_trainer(tokenizer, "rloo", **adaptive)
    interrupted.iteration()
    checkpoint.save(tmp_path / "resume.pt", {"trainer": interrupted.state_dict()})
    resumed = tiny_trainer(tokenizer, "rloo", **adaptive)
    resumed.load_state_dict(checkpoint.load(tmp_path / "resume.pt")["trainer"])
    assert resumed.iteration()[0]["beta"] == used_betas[1]
    assert resumed.kl_ctl.beta == uninterrupted.kl_ctl.beta


def test_a_grpo_iteration_with_dynamic_sampling_trains_on_informative_groups_only(tokenizer):
    def half_right(prompt: str, response: str) -> float:
        return float(len(response) % 2)  # random models: groups both tie and differ

    trainer = tiny_trainer(
        tokenizer, "grpo", rule=half_right, batch_size=4, group_size=2, minibatch_size=4,
        max_sampling_rounds=3,
    )  # fmt: skip
    stats, batch = trainer.iteration()
    scores = batch.scores.view(-1, 2)
    assert (scores[:, 0] != scores[:, 1]).all()  # every group kept is informative
    assert stats["informative_groups"] == len(scores) <= 4
    assert 1 <= stats["sampling_rounds"] <= 3
    assert (batch.advantages.abs().sum(-1) > 0).all()
