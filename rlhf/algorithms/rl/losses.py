"""Policy and value losses and their statistics, on [B, N] response-token tensors with a mask.

Every statistic is a mean over real response tokens only: a padded position after the end
token is neither an action nor a state, and averaging it in would dilute every loss by the
batch's length spread. Padding is selected away, never multiplied by zero: an inf or NaN in a
padded column (a logit of a token that was never sampled) would otherwise poison the sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over the entries where the boolean mask is True (0 when there are none)."""
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Unbiased variance over the masked entries."""
    mean = masked_mean(x, mask)
    return torch.where(mask, (x - mean) ** 2, 0.0).sum() / (mask.sum() - 1).clamp(min=1)


def token_weights(mask: Tensor, aggregation: str, max_new_tokens: int) -> Tensor | None:
    """How much each response token [B, N] of these rows counts in their loss, the rows being
    answers of equal weight (`loss_aggregation`): None for the token mean (`masked_mean`, every
    token alike, the rows weighed by their tokens); `answer_mean`, 1 / (the answer's length *
    rows); `fixed_length`, 1 / (max_new_tokens * rows), Dr. GRPO's constant normalizer."""
    if aggregation == "token_mean":
        return None
    rows = mask.shape[0]
    if aggregation == "answer_mean":
        return mask / (mask.sum(-1, keepdim=True).clamp(min=1) * rows)
    if aggregation == "fixed_length":
        return mask / (max_new_tokens * rows)
    raise ValueError(f"no loss aggregation {aggregation!r}")


def aggregate(x: Tensor, mask: Tensor, weights: Tensor | None) -> Tensor:
    """x [B, N] over the masked tokens: their mean (weights None), else their weighted sum."""
    if weights is None:
        return masked_mean(x, mask)
    return torch.where(mask, x * weights, 0.0).sum()


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """GSPO's ratio on every token [B, N]: in value, the answer's mean log-ratio (the log of
    its geometric-mean ratio); in gradient, the token's own log-prob, so that the answer's
    tokens together carry the gradient of the answer's ratio."""
    row_mean = torch.where(mask, logprobs - old_logprobs, 0.0).sum(-1, keepdim=True) / mask.sum(
        -1, keepdim=True
    ).clamp(min=1)  # [B, 1]
    return row_mean.detach() + logprobs - logprobs.detach()


def whiten(x: Tensor, mask: Tensor) -> Tensor:
    """Zero mean, unit variance over the masked entries; masked-out entries become 0."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    return torch.where(mask, (x - mean) * torch.rsqrt(var + 1e-8), 0.0)


@dataclass(frozen=True)
class PolicyLoss:
    loss: Tensor
    clip_fraction: Tensor
    approx_kl: Tensor  # k3 estimate of KL(rollout policy || current policy)


def _approx_kl(log_ratio: Tensor, mask: Tensor, weights: Tensor | None = None) -> Tensor:
    """k3 = (r - 1) - log r with r = pi / pi_rollout, over the rollout's own tokens (added up
    as the loss is, `aggregate`): an unbiased, non-negative estimate of KL(rollout policy ||
    current policy)."""
    with torch.no_grad():
        return aggregate(torch.expm1(log_ratio) - log_ratio, mask, weights)


def clipped_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip: float,
    *,
    clip_high: float | None = None,
    sequence_ratio: bool = False,
    weights: Tensor | None = None,
) -> PolicyLoss:
    """PPO's clipped surrogate over the masked tokens (`aggregate` with `weights`): the ratio
    clipped to [1 - clip, 1 + clip_high] (clip_high None: clip), each token's own ratio or,
    with `sequence_ratio`, its answer's (GSPO)."""
    log_ratio = logprobs - old_logprobs
    if sequence_ratio:
        log_ratio = sequence_log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    high = clip if clip_high is None else clip_high
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + high)
    with torch.no_grad():
        clip_fraction = aggregate((clipped > unclipped).float(), mask, weights)
    return PolicyLoss(
        aggregate(torch.maximum(unclipped, clipped), mask, weights),
        clip_fraction,
        _approx_kl(logprobs - old_logprobs, mask, weights),
    )


def policy_gradient_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor | None = None,
) -> PolicyLoss:
    """The policy-gradient loss -A log pi over the masked tokens (`aggregate` with
    `weights`): no ratio, no clipping."""
    return PolicyLoss(
        aggregate(-advantages * logprobs, mask, weights),
        torch.zeros((), device=mask.device),
        _approx_kl(logprobs - old_logprobs, mask, weights),
    )


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float,
    weights: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Half the larger of the plain and the clipped squared error over the masked tokens
    (`aggregate` with `weights`, as the policy's loss); and the share of tokens where
    clipping bound."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    plain_err, clipped_err = (values - returns) ** 2, (clipped - returns) ** 2
    with torch.no_grad():
        clip_fraction = aggregate((clipped_err > plain_err).float(), mask, weights)
    return 0.5 * aggregate(torch.maximum(plain_err, clipped_err), mask, weights), clip_fraction


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(returns - values) / Var(returns): 1 is a perfect critic, 0 a constant one."""
    var = masked_var(returns, mask)
    if float(var) == 0.0:
        return math.nan
    return float(1.0 - masked_var(returns - values, mask) / var)
