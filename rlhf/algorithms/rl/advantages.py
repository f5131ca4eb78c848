"""Advantage estimators: how each algorithm turns a rollout's rewards into a learning signal.

All take per-token rewards [B, N] (the sequence score on the last real token, plus, for
algorithms that penalize KL in the reward, -beta * KL on every token), the critic's values
[B, N] where the algorithm has a critic, the response mask [B, N] and the algorithm's params;
all return advantages [B, N] and, for a critic to regress on, returns [B, N] (else None).
Rows of one prompt's group are consecutive: a rollout of G prompts with k answers each is
[G * k] rows, prompt g's answers in rows g * k ... g * k + k - 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf.algorithms.rl.losses import whiten
from rlhf.params.groups import GRPOParams, PolicyOptimParams, PPOParams


def overlong_penalty(lengths: Tensor, max_new_tokens: int, buffer: int, penalty: float) -> Tensor:
    """DAPO's overlong shaping [B] (buffer > 0): 0 for an answer shorter than max_new_tokens
    - buffer, then rising linearly to `penalty` at max_new_tokens: a cut answer is penalized
    without the noise of scoring its truncation as if it were finished."""
    into = (lengths.float() - (max_new_tokens - buffer)) / buffer
    return penalty * into.clamp(0.0, 1.0)


def token_rewards(scores: Tensor, kl_penalty: Tensor, mask: Tensor) -> Tensor:
    """Per-token rewards [B, N]: the KL penalty [B, N] on every response token, plus the
    sequence score [B] on its last real token."""
    last = (mask.long().cumsum(-1) == mask.sum(-1, keepdim=True)) & mask
    return kl_penalty + scores[:, None] * last


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over right-padded responses [B, N].

    The episode ends after the last real token: its successor's value counts as 0.
    Returns (advantages, returns), both 0 on padding.
    """
    rewards, values = torch.where(mask, rewards, 0.0), torch.where(mask, values, 0.0)
    live = mask.to(rewards.dtype)
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    next_value = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * live[:, t]
        advantages[:, t] = running
        next_value = values[:, t]
    return advantages, torch.where(mask, advantages + values, 0.0)


def gae_advantages(
    rewards: Tensor, values: Tensor | None, mask: Tensor, cfg: PolicyOptimParams
) -> tuple[Tensor, Tensor | None]:
    """PPO: per-token GAE against the critic, whitened over the batch."""
    assert values is not None and isinstance(cfg, PPOParams)
    advantages, returns = gae(rewards, values, mask, cfg.gamma, cfg.lam)
    return whiten(advantages, mask), returns


def baseline_advantages(
    rewards: Tensor, values: Tensor | None, mask: Tensor, cfg: PolicyOptimParams
) -> tuple[Tensor, Tensor | None]:
    """REINFORCE with a learned baseline: one advantage per answer on each of its tokens, the
    whole return (score plus every token's KL penalty) minus the critic's value before the
    first token, whitened; the undiscounted returns-to-go are what the critic regresses on."""
    assert values is not None
    returns = torch.where(mask, rewards.flip(-1).cumsum(-1).flip(-1), 0.0)
    return whiten(torch.where(mask, returns[:, :1] - values[:, :1], 0.0), mask), returns


def _group_returns(rewards: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """Each answer's whole return, grouped by prompt [G, k]."""
    return torch.where(mask, rewards, 0.0).sum(-1).view(-1, group_size)


def rloo_advantages(
    rewards: Tensor, values: Tensor | None, mask: Tensor, cfg: PolicyOptimParams
) -> tuple[Tensor, Tensor | None]:
    """RLOO: each answer's return minus the mean return of the other answers to its prompt,
    an unbiased baseline that needs no critic (Kool et al. 2019, Ahmadian et al. 2024)."""
    returns = _group_returns(rewards, mask, cfg.group_size)  # [G, k]
    others = (returns.sum(-1, keepdim=True) - returns) / (cfg.group_size - 1)
    return torch.where(mask, (returns - others).reshape(-1, 1), 0.0), None


# Added to the group's std so that a group of near-equal scores does not blow up (as TRL).
GROUP_STD_EPS = 1e-4


def grpo_advantages(
    rewards: Tensor, values: Tensor | None, mask: Tensor, cfg: PolicyOptimParams
) -> tuple[Tensor, Tensor | None]:
    """GRPO: each answer's score standardized within its prompt's group (mean and unbiased
    std of the group), on every token of the answer; a group whose answers all score the same
    gives no signal. Without `std_normalize` (Dr. GRPO), only the group mean is taken off."""
    assert isinstance(cfg, GRPOParams)
    returns = _group_returns(rewards, mask, cfg.group_size)  # [G, k]
    centered = returns - returns.mean(-1, keepdim=True)
    if cfg.std_normalize:
        centered = centered / (returns.std(-1, keepdim=True) + GROUP_STD_EPS)
    return torch.where(mask, centered.reshape(-1, 1), 0.0), None
