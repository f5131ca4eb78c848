"""The KL divergence to the reference policy: its per-token estimators and its coefficient."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def kl_per_token(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k1") -> Tensor:
    """Per-token estimate of KL(policy || reference) from log-probs of sampled tokens.

    k1 = log p - log q is unbiased but noisy and can be negative per token; k3 =
    (r - 1) - log r with r = q / p is unbiased, non-negative and has lower variance (Schulman).
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; use k1 or k3")


@dataclass
class KLController:
    """The KL coefficient beta: fixed, or adapted toward a target KL (Ziegler et al. 2019).

    Each update multiplies beta by 1 + clip(KL / target - 1, -0.2, 0.2) * n / horizon, so
    beta grows when the policy drifts further than the target and shrinks when it stays close.
    """

    beta: float
    target: float | None = None
    horizon: int = 10_000

    def update(self, current_kl: float, n_samples: int) -> None:
        if self.target is None:
            return
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.beta *= 1.0 + error * n_samples / self.horizon

    def state(self) -> dict[str, float]:
        return {"beta": self.beta}

    def load(self, state: dict[str, float]) -> None:
        self.beta = float(state["beta"])
