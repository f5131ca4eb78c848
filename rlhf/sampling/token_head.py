"""The chosen tokens' log-probs and the entropies of their distributions, the LM head inside,
a chunk of tokens at a time.

RL's update reads two things from the head at every response token: the log-prob of the token
the rollout chose, and (for the entropy bonus, or only to log it) the entropy of the whole
next-token distribution; RL's scoring pass and DPO read the log-probs. Computed plainly, from
`lm_head(hidden).float() / temperature`, they hold float32 logits over the vocabulary for
every token, their log-softmax and its exponent, each kept for the backward pass:
[16, 128, 50,257] floats are 412 MB apiece at GPT-2's vocabulary, for a minibatch of 16
answers. Here `TokenHead` runs the head on `CHUNK_TOKENS` tokens at a time and keeps nothing
of the vocabulary's width: the backward pass computes each chunk's logits again (one more
matmul of the head) and writes its gradient out, softmax minus one-hot for the log-prob and
-p (log p + H) for the entropy, in ATen ops that compile whole.
`response_forward` takes this path, compiled, where the stage compiled the model's blocks
(CUDA); elsewhere the plain computation stays, so the CPU's numbers are the ones they were.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_TOKENS = 4096  # as the LM loss's chunks (`rlhf.algorithms.lm_loss`): [4096, V] floats


def entropy(logits: Tensor) -> Tensor:
    """Entropy of each position's distribution [..., V] -> [...]."""
    return entropy_of(torch.log_softmax(logits.float(), dim=-1))


def entropy_of(logp: Tensor) -> Tensor:
    """Entropy [...] of distributions given by their log-probs [..., V]."""
    return -(logp.exp() * logp).sum(-1)


def chunk_logp(
    hidden: Tensor, weight: Tensor, temperature: float, vocab: int, dtype: torch.dtype | None
) -> tuple[Tensor, torch.dtype]:
    """Log-softmax [n, V] of the logits `hidden @ weight.T / temperature` over the real
    vocabulary (`weight`'s [V', C] first `vocab` rows; the rest are padding), and the dtype
    the head's matmul ran in. `dtype`: run it in this one (the forward's, again in the
    backward, where autocast is off), else as autocast has it."""
    if dtype is None:
        out = F.linear(hidden, weight)  # [n, V']; bfloat16 under autocast
    else:
        out = F.linear(hidden.to(dtype), weight.to(dtype))
    return (out[:, :vocab].float() / temperature).log_softmax(-1), out.dtype


def chunk_values(
    hidden: Tensor, weight: Tensor, tokens: Tensor, temperature: float, vocab: int
) -> tuple[Tensor, Tensor, torch.dtype]:
    """A chunk's log-prob of each of its `tokens` [n] and each position's entropy, [n] each,
    and the dtype of the head's matmul."""
    logp, dtype = chunk_logp(hidden, weight, temperature, vocab, None)
    chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
    return chosen, entropy_of(logp), dtype


def chunk_grads(
    hidden: Tensor, weight: Tensor, tokens: Tensor, temperature: float, vocab: int,
    dtype: torch.dtype, grad_chosen: Tensor, grad_entropy: Tensor | None, for_hidden: bool,
    for_weight: bool,
) -> tuple[Tensor | None, Tensor | None]:  # fmt: skip
    """The chunk's gradients for `hidden` [n, C] and the head's `weight` [V', C], where
    asked, from those of its log-probs and entropies [n] (None: the entropies feed no loss):
    d log p_t / dz = onehot_t - p and dH / dz = -p (log p + H), over logits z scaled by the
    temperature."""
    logp, _ = chunk_logp(hidden, weight, temperature, vocab, dtype)  # [n, V]
    p = logp.exp()
    grad = (-p * grad_chosen[:, None]).scatter_add(-1, tokens[:, None], grad_chosen[:, None])
    if grad_entropy is not None:
        values = entropy_of(logp)[:, None]  # [n, 1]
        grad = grad - p * (logp + values) * grad_entropy[:, None]
    grad_out = F.pad(grad / temperature, (0, weight.shape[0] - vocab)).to(dtype)  # [n, V']
    grad_hidden = grad_out.mm(weight.to(dtype)).to(hidden.dtype) if for_hidden else None
    grad_weight = grad_out.t().mm(hidden.to(dtype)).to(weight.dtype) if for_weight else None
    return grad_hidden, grad_weight


@functools.cache
def compiled_chunks() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """`chunk_values` and `chunk_grads` compiled whole (a chunk of another length compiles
    once more, with its length dynamic), for the models whose blocks are compiled."""
    return torch.compile(chunk_values, fullgraph=True), torch.compile(chunk_grads, fullgraph=True)


class TokenHead(torch.autograd.Function):
    """Log-probs and entropies [N] of `tokens` [N] from hidden [N, C] and the head's weight
    [V', C], chunk by chunk; nothing vocabulary-wide is kept for the backward pass."""

    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, tokens: Tensor, temperature: float,
        vocab: int, compiled: bool,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        values, _ = compiled_chunks() if compiled else (chunk_values, chunk_grads)
        # float32 like every chunk's; a response of no tokens gives empty ones
        chosen = [hidden.new_empty(0, dtype=torch.float32)]
        entropies, dtype = chosen[:], hidden.dtype
        for start in range(0, hidden.shape[0], CHUNK_TOKENS):
            chunk = slice(start, start + CHUNK_TOKENS)
            logprob, value, dtype = values(hidden[chunk], weight, tokens[chunk], temperature, vocab)
            chosen.append(logprob)
            entropies.append(value)
        ctx.save_for_backward(hidden, weight, tokens)
        ctx.options = (temperature, vocab, dtype, compiled)  # dtype: the head's matmuls
        ctx.set_materialize_grads(False)
        return torch.cat(chosen), torch.cat(entropies)

    @staticmethod
    def backward(
        ctx: Any, grad_chosen: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, None, None, None, None]:
        hidden, weight, tokens = ctx.saved_tensors
        temperature, vocab, dtype, compiled = ctx.options
        for_hidden, for_weight = ctx.needs_input_grad[:2]
        _, grads = compiled_chunks() if compiled else (chunk_values, chunk_grads)
        if grad_chosen is None:
            grad_chosen = torch.zeros(tokens.shape, device=tokens.device)
        grad_hidden = torch.zeros_like(hidden) if for_hidden else None
        grad_weight = torch.zeros_like(weight) if for_weight else None
        for start in range(0, hidden.shape[0], CHUNK_TOKENS):
            chunk = slice(start, start + CHUNK_TOKENS)
            chunk_hidden, chunk_weight = grads(
                hidden[chunk], weight, tokens[chunk], temperature, vocab, dtype,
                grad_chosen[chunk], None if grad_entropy is None else grad_entropy[chunk],
                for_hidden, for_weight,
            )  # fmt: skip
            if grad_hidden is not None:
                grad_hidden[chunk] = chunk_hidden
            if grad_weight is not None:
                grad_weight += chunk_weight
        return grad_hidden, grad_weight, None, None, None, None


def token_head(
    hidden: Tensor, weight: Tensor, tokens: Tensor, temperature: float, vocab: int,
    compiled: bool,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Log-probs of `tokens` [B, N] and the entropies of their distributions, [B, N] each,
    from hidden states [B, N, C] and the head's `weight` [V', C] (its first `vocab` rows
    real) at `temperature`; `compiled`: through the compiled chunks."""
    chosen, entropies = TokenHead.apply(
        hidden.flatten(0, 1), weight, tokens.flatten(), temperature, vocab, compiled
    )
    return chosen.view(tokens.shape), entropies.view(tokens.shape)
