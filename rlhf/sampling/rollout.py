"""Rollouts for RL: batched KV-cache sampling laid out for one full forward per model.

A rollout lays each row out as `[left-padded prompt | response, padded after the end token]`,
so response token t of every row sits in column P + t and every model (policy, reference,
critic) reads its per-token quantities from the same columns (`forward.py`). The pad id is
never the end token: a model that learns pad == end learns never to stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf.models.backbone import Backbone
from rlhf.sampling.generate import generate
from rlhf.sampling.sampler import SamplingConfig
from rlhf.sampling.streams import RandomSource
from rlhf.tokenizer.chat import decode_response, prompt_ids
from rlhf.tokenizer.tokenizer import Tokenizer


@dataclass
class Rollout:
    prompts: list[str]
    responses: list[str]  # decoded up to the end token
    sequences: Tensor  # [B, P + N] prompt and response ids
    attention_mask: Tensor  # [B, P + N] True on real tokens
    response_mask: Tensor  # [B, N] True on response tokens, the end token included
    logprobs: Tensor  # [B, N] sampling log-probs (temperature-scaled logits)
    ended: Tensor  # [B] True where the row emitted the end token
    prompt_width: int  # P

    @property
    def lengths(self) -> Tensor:
        return self.response_mask.sum(-1)


@torch.no_grad()
def sample_rollout(
    policy: Backbone,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    config: SamplingConfig,
    generator: RandomSource = None,
) -> Rollout:
    out = generate(
        policy,
        [prompt_ids(tokenizer, p) for p in prompts],
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        config=config,
        generator=generator,
        decodable=tokenizer.vocab_size,
    )
    return Rollout(
        prompts=list(prompts),
        responses=[decode_response(tokenizer, ids) for ids in out.tokens.tolist()],
        sequences=torch.cat([out.prompt, out.tokens], dim=1),
        attention_mask=torch.cat([out.prompt_mask, out.mask], dim=1),
        response_mask=out.mask,
        logprobs=out.logprobs,
        ended=out.ended,
        prompt_width=out.prompt.shape[1],
    )
