"""Rollouts for RL: batched KV-cache sampling, then one full forward per model to score them.

A rollout lays each row out as `[left-padded prompt | response, padded after the end token]`,
so response token t of every row sits in column P + t and every model (policy, reference,
critic) reads its per-token quantities from the same columns. The pad id is never the end
token: a model that learns pad == end learns never to stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from rlhf.generation import SamplingConfig, generate
from rlhf.model import GPT
from rlhf.tokenizer import Tokenizer


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
    def tokens(self) -> Tensor:
        """Response ids [B, N]."""
        return self.sequences[:, self.prompt_width :]

    @property
    def lengths(self) -> Tensor:
        return self.response_mask.sum(-1)


@torch.no_grad()
def sample_rollout(
    policy: GPT,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    config: SamplingConfig,
    generator: torch.Generator | None = None,
) -> Rollout:
    out = generate(
        policy,
        [tokenizer.encode_prompt(p) for p in prompts],
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        config=config,
        generator=generator,
    )
    return Rollout(
        prompts=list(prompts),
        responses=[tokenizer.decode_response(ids) for ids in out.tokens.tolist()],
        sequences=torch.cat([out.prompt, out.tokens], dim=1),
        attention_mask=torch.cat([out.prompt_mask, out.mask], dim=1),
        response_mask=out.mask,
        logprobs=out.logprobs,
        ended=out.ended,
        prompt_width=out.prompt.shape[1],
    )


@dataclass
class ResponseForward:
    logits: Tensor  # [B, N, V] temperature-scaled logits that predict each response token
    logprobs: Tensor  # [B, N] log-prob of each response token
    hidden: Tensor  # [B, N, C] hidden state that predicts each response token


def response_forward(
    model: GPT,
    sequences: Tensor,
    attention_mask: Tensor,
    prompt_width: int,
    temperature: float = 1.0,
) -> ResponseForward:
    """One forward pass over prompt + response; quantities for the N response positions.

    The state that chooses response token t is the hidden state at column P + t - 1.
    """
    hidden = model.hidden(sequences, attention_mask)[:, prompt_width - 1 : -1]  # [B, N, C]
    logits = model.lm_head(hidden).float() / temperature
    tokens = sequences[:, prompt_width:]
    logprobs = F.log_softmax(logits, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    return ResponseForward(logits=logits, logprobs=logprobs, hidden=hidden)


def response_values(
    critic: GPT, sequences: Tensor, attention_mask: Tensor, prompt_width: int
) -> Tensor:
    """Critic values [B, N] of the state before each response token."""
    hidden = critic.hidden(sequences, attention_mask)
    return critic.values(hidden[:, prompt_width - 1 : -1]).float()
