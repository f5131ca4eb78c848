"""One forward pass over whole sequences, read at the response positions.

The state that chooses token t is the hidden state at column t - 1, so the log-prob of every
token from column `start` on comes from the hidden states at columns start - 1 ... T - 2. The
LM head runs on those columns only: with vocabularies of tens of thousands of tokens it costs
more than the trunk at the prompt positions. The trunk runs padding-free
(`rlhf.models.packing`): most of a rollout's columns are padding. Rollouts (every response
starts at column P), the evaluation's KL and DPO (responses start where each row's prompt
ends) all use this one function. A model whose blocks are compiled reads the head chunk by
chunk, compiled too (`rlhf.sampling.token_head`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from rlhf.models.backbone import Backbone
from rlhf.models.packing import Packing, packed_hidden_states, packed_rows
from rlhf.sampling.token_head import entropy, token_head


@dataclass
class ResponseForward:
    logprobs: Tensor  # [B, N] log-prob of each token
    entropy: Tensor | None  # [B, N] entropy of the distribution each token was drawn from
    hidden: Tensor  # [B, N, C] hidden state that predicts each token


def response_forward(
    model: Backbone,
    ids: Tensor,
    attention_mask: Tensor,
    start: int,
    temperature: float = 1.0,
    packing: Packing | None = None,
    entropy_grad: bool | None = None,
) -> ResponseForward:
    """Quantities for the N = T - start tokens ids[:, start:] of ids [B, T], from one forward
    at `temperature`; attention_mask [B, T] marks real tokens; `packing`, the rows'
    (`packed_rows`), made here when not given; `entropy_grad`: None, no entropies; False,
    entropies that take no gradient (logged); True, ones a loss differentiates. Padded
    positions hold finite values that mean nothing: callers select them away."""
    real = attention_mask.bool()
    hidden = packed_hidden_states(model, ids, real, packing)[:, start - 1 : -1]
    tokens = ids[:, start:]  # [B, N]
    entropies: Tensor | None = None
    if model.compiled_blocks is not None:  # the entropies come with the chunks, almost free
        weight, vocab = model.head_weight(hidden.numel() // hidden.shape[-1])
        logprobs, entropies = token_head(hidden, weight, tokens, temperature, vocab, True)
        entropies = entropies if entropy_grad else entropies.detach()
    else:
        logits = model.lm_logits(hidden).float() / temperature  # [B, N, V]
        logprobs = F.log_softmax(logits, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
        if entropy_grad is not None:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                entropies = entropy(logits)
    return ResponseForward(
        logprobs=logprobs, entropy=None if entropy_grad is None else entropies, hidden=hidden
    )


def response_values(
    critic: Backbone,
    ids: Tensor,
    attention_mask: Tensor,
    start: int,
    packing: Packing | None = None,
) -> Tensor:
    """Critic values [B, N] of the state before each token from column `start` on."""
    hidden = packed_hidden_states(critic, ids, attention_mask.bool(), packing)  # [B, T, C]
    return critic.values(hidden[:, start - 1 : -1]).float()


KL_CHUNK_FLOATS = 1 << 24  # vocabulary-wide floats per model held at once (64 MB)


@dataclass
class ResponseKL:
    exact: Tensor  # [B, N] KL of the two next-token distributions at each response token
    reference_logprobs: Tensor  # [B, N] the reference's log-prob of each token


def response_kl(
    policy: Backbone,
    reference: Backbone,
    ids: Tensor,
    attention_mask: Tensor,
    start: int,
    temperature: float = 1.0,
) -> ResponseKL:
    """At each of the N = T - start tokens ids[:, start:] of ids [B, T]: the full-vocabulary
    KL(policy at `temperature` || reference as it is) of the distributions that chose the
    token, never negative, whose sum over an answer is the answer's KL in expectation with far
    less noise than the sampled log-ratio; and the reference's log-prob of the token, for that
    sampled estimate. The LM heads run a few positions at a time, so a large vocabulary never
    needs [B, N, V] floats at once."""
    real = attention_mask.bool()
    packing = packed_rows(policy, ids, real, real.sum(-1).tolist())  # both models', once
    hidden = packed_hidden_states(policy, ids, real, packing)[:, start - 1 : -1]  # [B, N, C]
    hidden_ref = packed_hidden_states(reference, ids, real, packing)[:, start - 1 : -1]
    tokens = ids[:, start:]  # [B, N]
    batch, width = tokens.shape
    step = max(1, KL_CHUNK_FLOATS // max(1, batch * policy.config.vocab_size))
    exact, chosen = [], []
    for i in range(0, width, step):
        mine = F.log_softmax(policy.lm_logits(hidden[:, i : i + step]).float() / temperature, -1)
        ref = F.log_softmax(reference.lm_logits(hidden_ref[:, i : i + step]).float(), -1)
        exact.append((mine.exp() * (mine - ref)).sum(-1).clamp_min(0.0))  # [B, step]
        chosen.append(ref.gather(-1, tokens[:, i : i + step, None]).squeeze(-1))
    return ResponseKL(exact=torch.cat(exact, 1), reference_logprobs=torch.cat(chosen, 1))
