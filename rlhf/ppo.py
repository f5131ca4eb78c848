"""PPO's arithmetic for language models, on [B, N] response-token tensors with a mask.

Every statistic is a mean over real response tokens only: a padded position after the end
token is neither an action nor a state, and averaging it in would dilute every loss by the
batch's length spread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Unbiased variance over the masked entries."""
    mean = masked_mean(x, mask)
    n = mask.sum()
    return ((x - mean) ** 2 * mask).sum() / (n - 1).clamp(min=1)


def whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """Zero mean, unit variance over the masked entries; masked-out entries become 0."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        out = out + mean
    return out * mask


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


def token_rewards(scores: Tensor, kl: Tensor, mask: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """Per-token rewards [B, N]: -beta * KL on every response token, plus the sequence score
    [B] on its last real token. Returns (rewards, non-score part)."""
    non_score = -beta * kl * mask
    last = (mask.long().cumsum(-1) == mask.sum(-1, keepdim=True)) & mask.bool()
    return non_score + scores[:, None] * last, non_score


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over right-padded responses [B, N].

    The episode ends after the last real token: its successor's value counts as 0.
    Returns (advantages, returns), both 0 on padding.
    """
    rewards, values, mask = rewards * mask, values * mask, mask.to(rewards.dtype)
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    next_value = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * mask[:, t]
        advantages[:, t] = running
        next_value = values[:, t]
    return advantages, (advantages + values) * mask


@dataclass(frozen=True)
class PolicyLoss:
    loss: Tensor
    clip_fraction: Tensor
    approx_kl: Tensor  # k3 estimate of KL(rollout policy || current policy)


def clipped_policy_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, clip: float
) -> PolicyLoss:
    """PPO's clipped surrogate as a masked token mean."""
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped > unclipped).float(), mask)
        approx_kl = masked_mean(torch.expm1(log_ratio) - log_ratio, mask)
    return PolicyLoss(
        masked_mean(torch.maximum(unclipped, clipped), mask), clip_fraction, approx_kl
    )


def sequence_advantages(rewards: Tensor, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """REINFORCE with a learned baseline: one advantage per answer on each of its tokens, the
    whole return (score plus every token's KL penalty) minus the critic's value before the
    first token; and the undiscounted returns-to-go the critic regresses on. [B, N] each."""
    returns = rewards.flip(-1).cumsum(-1).flip(-1) * mask
    return (returns[:, :1] - values[:, :1]) * mask, returns


def reinforce_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
) -> PolicyLoss:
    """The policy-gradient loss -A log pi as a masked token mean: no ratio, no clipping."""
    with torch.no_grad():
        log_ratio = logprobs - old_logprobs
        approx_kl = masked_mean(torch.expm1(log_ratio) - log_ratio, mask)
    return PolicyLoss(
        masked_mean(-advantages * logprobs, mask), torch.zeros((), device=mask.device), approx_kl
    )


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float
) -> tuple[Tensor, Tensor]:
    """Half the larger of the plain and the clipped squared error, masked token mean;
    and the share of tokens where clipping bound."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    plain_err, clipped_err = (values - returns) ** 2, (clipped - returns) ** 2
    with torch.no_grad():
        clip_fraction = masked_mean((clipped_err > plain_err).float(), mask)
    return 0.5 * masked_mean(torch.maximum(plain_err, clipped_err), mask), clip_fraction


def entropy(logits: Tensor) -> Tensor:
    """Entropy of each position's distribution [..., V] -> [...]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(returns - values) / Var(returns): 1 is a perfect critic, 0 a constant one."""
    var = masked_var(returns, mask)
    if float(var) == 0.0:
        return math.nan
    return float(1.0 - masked_var(returns - values, mask) / var)


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
