"""RL algorithms by name: each is an advantage estimator, a policy loss, and where the KL to
the reference goes. The trainer (`trainer.py`) runs any of them; an algorithm's params group
(rlhf/params/groups.py, one per name) says what else it has, such as a critic or a clipped ratio.

Adding an algorithm is one entry here plus its params group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from rlhf.algorithms.rl.advantages import (
    baseline_advantages,
    gae_advantages,
    grpo_advantages,
    rloo_advantages,
)
from rlhf.algorithms.rl.losses import PolicyLoss, clipped_policy_loss, policy_gradient_loss
from rlhf.params.groups import (
    ClipParams,
    GRPOParams,
    PolicyOptimParams,
    PPOParams,
    ReinforceParams,
    RLOOParams,
)

# (rewards [B, N], values [B, N] | None, mask [B, N], params) -> (advantages, returns | None)
AdvantageEstimator = Callable[
    [Tensor, Tensor | None, Tensor, PolicyOptimParams], tuple[Tensor, Tensor | None]
]
# (logprobs, rollout logprobs, advantages, mask, token weights or None (`token_weights`),
# params), all [B, N] -> the loss and its stats
PolicyLossFn = Callable[
    [Tensor, Tensor, Tensor, Tensor, Tensor | None, PolicyOptimParams], PolicyLoss
]


def clipped_surrogate(
    logprobs: Tensor,
    old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor | None,
    cfg: PolicyOptimParams,
) -> PolicyLoss:
    assert isinstance(cfg, ClipParams)
    return clipped_policy_loss(
        logprobs, old, advantages, mask, cfg.cliprange,
        clip_high=cfg.cliprange_high or None,
        sequence_ratio=cfg.importance_ratio == "sequence",
        weights=weights,
    )  # fmt: skip


def policy_gradient(
    logprobs: Tensor,
    old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor | None,
    cfg: PolicyOptimParams,
) -> PolicyLoss:
    return policy_gradient_loss(logprobs, old, advantages, mask, weights)


@dataclass(frozen=True)
class Algorithm:
    name: str
    params: type[PolicyOptimParams]  # the type of its params group
    advantages: AdvantageEstimator
    policy_loss: PolicyLossFn
    # "reward": -kl_coef * KL on every token's reward (InstructGPT); "loss": kl_coef times the
    # k3 KL estimate added to the loss (GRPO)
    kl_penalty: Literal["reward", "loss"]


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("ppo", PPOParams, gae_advantages, clipped_surrogate, "reward"),
        Algorithm("reinforce", ReinforceParams, baseline_advantages, policy_gradient, "reward"),
        Algorithm("rloo", RLOOParams, rloo_advantages, policy_gradient, "reward"),
        Algorithm("grpo", GRPOParams, grpo_advantages, clipped_surrogate, "loss"),
    )
}
