import math

import pytest
import torch

from rlhf.algorithms.rl.advantages import (
    baseline_advantages,
    gae,
    grpo_advantages,
    rloo_advantages,
    token_rewards,
)
from rlhf.algorithms.rl.kl import KLController, kl_per_token
from rlhf.algorithms.rl.losses import (
    clipped_policy_loss,
    clipped_value_loss,
    masked_mean,
    masked_var,
    policy_gradient_loss,
    whiten,
)
from rlhf.params import GRPOParams, ReinforceParams, RLOOParams


def test_gae_against_a_hand_worked_example():
    # one response of 3 tokens then padding; gamma 0.9, lambda 0.5
    rewards = torch.tensor([[0.0, 0.0, 1.0, 7.0]])  # the 7 sits on padding and must be ignored
    values = torch.tensor([[0.5, 0.2, 0.4, 9.0]])
    mask = torch.tensor([[True, True, True, False]])
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    d2 = 1.0 + 0.9 * 0.0 - 0.4  # the last token: its successor's value is 0
    d1 = 0.0 + 0.9 * 0.4 - 0.2
    d0 = 0.0 + 0.9 * 0.2 - 0.5
    a2 = d2
    a1 = d1 + 0.45 * a2
    a0 = d0 + 0.45 * a1
    torch.testing.assert_close(advantages, torch.tensor([[a0, a1, a2, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[a0 + 0.5, a1 + 0.2, a2 + 0.4, 0.0]]))


def test_gae_with_gamma_and_lambda_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.1, -0.2, 0.3, 1.0], [0.5, 2.0, 0.0, 0.0]])
    values = torch.tensor([[0.3, 0.1, 0.0, 0.2], [1.0, 0.4, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]).bool()
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    to_go = torch.tensor([[1.2, 1.1, 1.3, 1.0], [2.5, 2.0, 0.0, 0.0]])
    torch.testing.assert_close(returns, to_go)
    torch.testing.assert_close(advantages, (to_go - values) * mask)


def test_reward_sits_on_the_last_real_token_under_left_padded_prompts():
    # responses of length 3 and 1 (then padding); the KL penalty covers every response token
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]).bool()
    penalty = torch.tensor([[-0.05, -0.1, -0.15, 0], [-0.25, 0, 0, 0]])
    rewards = token_rewards(torch.tensor([2.0, -1.0]), penalty, mask)
    torch.testing.assert_close(
        rewards, torch.tensor([[-0.05, -0.1, 1.85, 0.0], [-1.25, 0.0, 0.0, 0.0]])
    )


def test_whitening_uses_masked_entries_only():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -50.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]).bool()
    out = whiten(x, mask)
    real = out[mask]
    assert real.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert real.std().item() == pytest.approx(1.0, abs=1e-4)
    assert out[~mask].abs().sum().item() == 0.0
    expected = (torch.tensor([1.0, 2, 3, 4, 5]) - 3) / torch.tensor([1.0, 2, 3, 4, 5]).std()
    torch.testing.assert_close(real, expected, atol=1e-4, rtol=1e-4)


def test_clipped_policy_loss_by_hand():
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))  # ratios 1.5, 0.5, 1.1
    adv = torch.tensor([[1.0, -2.0, 3.0]])
    mask = torch.tensor([[True, True, False]])  # the third token is padding
    out = clipped_policy_loss(new, old, adv, mask, clip=0.2)
    # token 0: max(-1*1.5, -1*1.2) = -1.2 (clipped); token 1: max(2*0.5, 2*0.8) = 1.6 (clipped)
    assert out.loss.item() == pytest.approx((-1.2 + 1.6) / 2, rel=1e-6)
    assert out.clip_fraction.item() == pytest.approx(1.0)
    ratios = torch.tensor([1.5, 0.5])
    k3 = ((ratios - 1) - torch.log(ratios)).mean()
    assert out.approx_kl.item() == pytest.approx(k3.item(), rel=1e-5)


def test_clipped_policy_loss_has_the_policy_gradient_inside_the_clip():
    new = torch.zeros(1, 2, requires_grad=True)
    adv = torch.tensor([[2.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = clipped_policy_loss(new, torch.zeros(1, 2), adv, mask, clip=0.2)
    out.loss.backward()
    torch.testing.assert_close(new.grad, -adv / 2)  # d/dlogp of -A * exp(logp - old) at ratio 1


def test_clipped_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.5, 0.5]])
    returns = torch.tensor([[2.0, 0.4]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, clip_fraction = clipped_value_loss(values, old, returns, mask, clip=0.2)
    # token 0: plain (1-2)^2 = 1, clipped (0.7-2)^2 = 1.69 -> 1.69
    # token 1: plain (0-0.4)^2 = 0.16, clipped (0.3-0.4)^2 = 0.01 -> 0.16
    assert loss.item() == pytest.approx(0.5 * (1.69 + 0.16) / 2, rel=1e-6)
    assert clip_fraction.item() == 0.5


def test_kl_estimators():
    logp = torch.log(torch.tensor([0.5, 0.2]))
    ref = torch.log(torch.tensor([0.25, 0.4]))
    torch.testing.assert_close(kl_per_token(logp, ref, "k1"), logp - ref)
    r = torch.tensor([0.5, 2.0])  # ref / policy
    torch.testing.assert_close(kl_per_token(logp, ref, "k3"), (r - 1) - torch.log(r))
    assert (kl_per_token(logp, ref, "k3") >= 0).all()
    with pytest.raises(ValueError, match="k2"):
        kl_per_token(logp, ref, "k2")


def test_adaptive_kl_controller_moves_beta_toward_the_target():
    fixed = KLController(0.1)
    fixed.update(current_kl=50.0, n_samples=64)
    assert fixed.beta == 0.1
    ctl = KLController(0.1, target=6.0, horizon=1000)
    ctl.update(current_kl=12.0, n_samples=100)  # error clipped to +0.2
    assert ctl.beta == pytest.approx(0.1 * (1 + 0.2 * 100 / 1000))
    ctl.update(current_kl=5.4, n_samples=100)  # error -0.1
    assert ctl.beta == pytest.approx(0.1 * 1.02 * (1 - 0.1 * 0.1))
    restored = KLController(0.5, target=6.0)
    restored.load(ctl.state())
    assert restored.beta == ctl.beta


def test_masked_statistics_ignore_padding_even_inf_and_nan():
    mask = torch.tensor([True, True, False])
    assert masked_mean(torch.tensor([1.0, 3.0, 100.0]), mask) == 2.0
    assert not math.isnan(masked_mean(torch.zeros(2), torch.zeros(2, dtype=torch.bool)).item())
    for poison in (math.inf, -math.inf, math.nan):
        x = torch.tensor([1.0, 3.0, poison])
        assert masked_mean(x, mask) == 2.0
        assert masked_var(x, mask) == 2.0
        assert torch.isfinite(whiten(x, mask)).all()
    # the gradient of a masked loss stays finite too: padding gets exactly zero
    x = torch.tensor([1.0, 3.0, math.inf], requires_grad=True)
    masked_mean(x * 2, mask).backward()
    assert x.grad.tolist() == [1.0, 1.0, 0.0]


def test_reinforce_has_one_advantage_per_answer():
    """Return = score + every token's KL penalty; the baseline is the value before token 0."""
    rewards = torch.tensor([[-0.1, -0.2, 1.0, 0.0], [0.3, 2.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.1, 0.9, 0.0], [-1.0, 0.4, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]).bool()
    advantages, returns = baseline_advantages(rewards, values, mask, ReinforceParams())
    raw = torch.tensor([[0.2] * 3 + [0.0], [3.3] * 2 + [0.0] * 2])
    torch.testing.assert_close(advantages, whiten(raw, mask))
    torch.testing.assert_close(returns, torch.tensor([[0.7, 0.8, 1.0, 0.0], [2.3, 2.0, 0.0, 0.0]]))


def test_policy_gradient_loss_is_the_plain_policy_gradient():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    advantages = torch.tensor([[2.0, 2.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    out = policy_gradient_loss(logprobs, logprobs.detach() - 0.3, advantages, mask)
    out.loss.backward()
    torch.testing.assert_close(out.loss, torch.tensor(3.0))  # -(2 * -1 + 2 * -2) / 2
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.0, -1.0, 0.0]]))
    assert out.clip_fraction.item() == 0.0 and out.approx_kl.item() > 0


# two prompts, three answers each; answers are rows 0-2 and 3-5, of 2 tokens at most
GROUP_MASK = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 0]]).bool()


def test_rloo_baseline_is_the_mean_return_of_the_other_answers():
    # returns: score on the last token plus a KL penalty on every token
    rewards = torch.tensor(
        [[-0.1, 1.0], [0.5, 9.0], [0.0, 0.2], [0.0, 0.0], [0.1, 0.3], [2.0, 0.0]]
    )
    advantages, returns = rloo_advantages(rewards, None, GROUP_MASK, RLOOParams(group_size=3))
    totals = [0.9, 0.5, 0.2, 0.0, 0.4, 2.0]  # padding (the 9.0) never counts
    expected = []
    for g in (0, 3):
        for i in range(3):
            others = [totals[g + j] for j in range(3) if j != i]
            expected.append(totals[g + i] - sum(others) / 2)
    want = torch.tensor(expected)[:, None].expand(6, 2) * GROUP_MASK
    torch.testing.assert_close(advantages, want)
    assert returns is None
    # each group's advantages sum to zero: the baseline is unbiased and centres the group
    torch.testing.assert_close(advantages[:, 0].view(2, 3).sum(-1), torch.zeros(2))


def test_grpo_standardizes_scores_within_each_prompts_group():
    scores = torch.tensor([1.0, 0.0, 0.5, 0.7, 0.7, 0.7])  # the second group all ties
    rewards = token_rewards(scores, torch.zeros(6, 2), GROUP_MASK)  # no KL in GRPO's reward
    advantages, returns = grpo_advantages(rewards, None, GROUP_MASK, GRPOParams(group_size=3))
    first = (torch.tensor([1.0, 0.0, 0.5]) - 0.5) / (0.5 + 1e-4)  # unbiased std of 1, 0, 0.5
    torch.testing.assert_close(advantages[:3, 0], first)
    assert advantages[3:].abs().sum() == 0  # all-equal scores: no signal
    assert (advantages[~GROUP_MASK] == 0).all() and returns is None
