"""KL estimators and the adaptive KL controller."""

import pytest
import torch

from rlhf.algorithms.rl.kl import KLController, kl_per_token


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
