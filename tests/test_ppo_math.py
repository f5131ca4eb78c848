import math

import pytest
import torch

from rlhf.ppo import (
    KLController,
    clipped_policy_loss,
    clipped_value_loss,
    gae,
    kl_per_token,
    masked_mean,
    reinforce_loss,
    sequence_advantages,
    token_rewards,
    whiten,
)


def test_gae_against_a_hand_worked_example():
    # one response of 3 tokens then padding; gamma 0.9, lambda 0.5
    rewards = torch.tensor([[0.0, 0.0, 1.0, 7.0]])  # the 7 sits on padding and must be ignored
    values = torch.tensor([[0.5, 0.2, 0.4, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
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
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    to_go = torch.tensor([[1.2, 1.1, 1.3, 1.0], [2.5, 2.0, 0.0, 0.0]])
    torch.testing.assert_close(returns, to_go)
    torch.testing.assert_close(advantages, (to_go - values) * mask)


def test_reward_sits_on_the_last_real_token_under_left_padded_prompts():
    # responses of length 3 and 1 (then padding); the KL penalty covers every response token
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.5, 9.0, 9.0, 9.0]])
    rewards, non_score = token_rewards(torch.tensor([2.0, -1.0]), kl, mask, beta=0.5)
    torch.testing.assert_close(non_score, torch.tensor([[-0.05, -0.1, -0.15, 0], [-0.25, 0, 0, 0]]))
    torch.testing.assert_close(
        rewards, torch.tensor([[-0.05, -0.1, 1.85, 0.0], [-1.25, 0.0, 0.0, 0.0]])
    )


def test_whitening_uses_masked_entries_only():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -50.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0]])
    out = whiten(x, mask)
    real = out[mask.bool()]
    assert real.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert real.std().item() == pytest.approx(1.0, abs=1e-4)
    assert out[~mask.bool()].abs().sum().item() == 0.0
    expected = (torch.tensor([1.0, 2, 3, 4, 5]) - 3) / torch.tensor([1.0, 2, 3, 4, 5]).std()
    torch.testing.assert_close(real, expected, atol=1e-4, rtol=1e-4)


def test_clipped_policy_loss_by_hand():
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))  # ratios 1.5, 0.5, 1.1
    adv = torch.tensor([[1.0, -2.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding
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
    out = clipped_policy_loss(new, torch.zeros(1, 2), adv, torch.ones(1, 2), clip=0.2)
    out.loss.backward()
    torch.testing.assert_close(new.grad, -adv / 2)  # d/dlogp of -A * exp(logp - old) at ratio 1


def test_clipped_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.5, 0.5]])
    returns = torch.tensor([[2.0, 0.4]])
    loss, clip_fraction = clipped_value_loss(values, old, returns, torch.ones(1, 2), clip=0.2)
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


def test_masked_mean_ignores_padding():
    assert masked_mean(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1.0, 1.0, 0.0])) == 2.0
    assert not math.isnan(masked_mean(torch.zeros(2), torch.zeros(2)).item())


def test_reinforce_has_one_advantage_per_answer():
    """Return = score + every token's KL penalty; the baseline is the value before token 0."""
    rewards = torch.tensor([[-0.1, -0.2, 1.0, 0.0], [0.3, 2.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.1, 0.9, 0.0], [-1.0, 0.4, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    advantages, returns = sequence_advantages(rewards, values, mask)
    torch.testing.assert_close(advantages, torch.tensor([[0.2] * 3 + [0.0], [3.3] * 2 + [0.0] * 2]))
    torch.testing.assert_close(returns, torch.tensor([[0.7, 0.8, 1.0, 0.0], [2.3, 2.0, 0.0, 0.0]]))


def test_reinforce_loss_is_the_plain_policy_gradient():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    advantages = torch.tensor([[2.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = reinforce_loss(logprobs, logprobs.detach() - 0.3, advantages, mask)  # no clip at 0.3
    out.loss.backward()
    torch.testing.assert_close(out.loss, torch.tensor(3.0))  # -(2 * -1 + 2 * -2) / 2
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.0, -1.0, 0.0]]))
    assert out.clip_fraction.item() == 0.0 and out.approx_kl.item() > 0
