"""The RL losses and masked statistics against hand-worked examples."""

import math

import pytest
import torch

from rlhf.algorithms.rl.losses import (
    clipped_policy_loss,
    clipped_value_loss,
    masked_mean,
    masked_var,
    policy_gradient_loss,
    whiten,
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


def test_policy_gradient_loss_is_the_plain_policy_gradient():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    advantages = torch.tensor([[2.0, 2.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    out = policy_gradient_loss(logprobs, logprobs.detach() - 0.3, advantages, mask)
    out.loss.backward()
    torch.testing.assert_close(out.loss, torch.tensor(3.0))  # -(2 * -1 + 2 * -2) / 2
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.0, -1.0, 0.0]]))
    assert out.clip_fraction.item() == 0.0 and out.approx_kl.item() > 0
