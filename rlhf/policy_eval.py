"""Sampling a policy on evaluation prompts, with its KL to a reference policy.

KL(policy || reference) per answer is estimated from the policy's own samples as the sum over
answer tokens of log p_policy - log p_reference: unbiased, and the quantity the KL penalty of
RLHF bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlhf.generation import SamplingConfig
from rlhf.model import GPT
from rlhf.rollout import response_forward, sample_rollout
from rlhf.tokenizer import Tokenizer


@dataclass
class PolicySamples:
    prompts: list[str]  # each evaluation prompt `n` times, in order
    responses: list[str]
    kl_to_reference: list[float]  # per answer; empty without a reference


@torch.no_grad()
def sample_policy(
    policy: GPT,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    *,
    n: int,
    config: SamplingConfig,
    seed: int,
    batch_size: int,
    reference: GPT | None = None,
) -> PolicySamples:
    """`n` answers per prompt, batched; the same seed gives the same answers."""
    device = next(policy.parameters()).device
    generator = torch.Generator(device).manual_seed(seed)
    repeated = [p for p in prompts for _ in range(n)]
    responses: list[str] = []
    kl: list[float] = []
    for start in range(0, len(repeated), batch_size):
        rollout = sample_rollout(
            policy, tokenizer, repeated[start : start + batch_size], config, generator
        )
        responses += rollout.responses
        if reference is not None:
            ref = response_forward(
                reference,
                rollout.sequences,
                rollout.attention_mask,
                rollout.prompt_width,
                config.temperature,
            )
            per_token = (rollout.logprobs - ref.logprobs) * rollout.response_mask
            kl += per_token.sum(-1).tolist()
    return PolicySamples(repeated, responses, kl)
