"""One forward pass over whole sequences, read at the response positions.

The state that chooses token t is the hidden state at column t - 1, so the log-prob of every
token from column `start` on comes from the hidden states at columns start - 1 ... T - 2. The
LM head runs on those columns only: with vocabularies of tens of thousands of tokens it costs
more than the trunk at the prompt positions. The trunk runs padding-free
(`rlhf.models.packing`): most of a rollout's columns are padding. Rollouts (every response
starts at column P), the evaluation's KL and DPO (responses start where each row's prompt
ends) all use this one function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from rlhf.models.backbone import Backbone
from rlhf.models.packing import packed_hidden_states


@dataclass
class ResponseForward:
    logits: Tensor  # [B, N, V] temperature-scaled logits that predict each token
    logprobs: Tensor  # [B, N] log-prob of each token
    hidden: Tensor  # [B, N, C] hidden state that predicts each token


def response_forward(
    model: Backbone, ids: Tensor, attention_mask: Tensor, start: int, temperature: float = 1.0
) -> ResponseForward:
    """Quantities for the N = T - start tokens ids[:, start:] of ids [B, T], from one forward;
    attention_mask [B, T] marks real tokens. Padded positions hold finite values that mean
    nothing: callers select them away."""
    hidden = packed_hidden_states(model, ids, attention_mask.bool())[:, start - 1 : -1]
    logits = model.lm_logits(hidden).float() / temperature
    logprobs = F.log_softmax(logits, dim=-1).gather(-1, ids[:, start:, None]).squeeze(-1)
    return ResponseForward(logits=logits, logprobs=logprobs, hidden=hidden)


def response_values(critic: Backbone, ids: Tensor, attention_mask: Tensor, start: int) -> Tensor:
    """Critic values [B, N] of the state before each token from column `start` on."""
    hidden = packed_hidden_states(critic, ids, attention_mask.bool())  # [B, T, C]
    return critic.values(hidden[:, start - 1 : -1]).float()
