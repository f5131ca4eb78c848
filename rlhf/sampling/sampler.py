"""Choosing the next token from a distribution: greedy, temperature, top-k and exact top-p.

The top-p nucleus follows one rule on every path: a token is in the nucleus when the tokens
strictly more likely than it hold less than `top_p` of the mass. Tied tokens are therefore in
or out together, whichever order a sort happens to put them in.

Every choice reads its randomness from uniforms it is handed ([B, R] per step, `draws_per_step`
of them), never from a generator, so a decoding step is a pure function of tensors: the same
numbers give the same tokens on the eager path and inside a compiled, graph-captured step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf.sampling.scan import running_sum


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int = 0  # 0 keeps every token
    top_p: float = 1.0  # nucleus mass; 1.0 keeps every token
    greedy: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (use greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


# Draws from the whole distribution a top-p step tries before falling back to a full sort
# (with one more uniform); with top_p = 0.9 a row gets there with probability 1e-8.
NUCLEUS_DRAWS = 8


def draws_per_step(config: SamplingConfig, vocab_size: int) -> int:
    """Uniforms one decoding step reads per row: none for greedy decoding, the nucleus's
    draws and its fallback's for top-p over the whole vocabulary, else one."""
    if config.greedy:
        return 0
    if config.top_p < 1.0 and not 0 < config.top_k < vocab_size:
        return NUCLEUS_DRAWS + 1
    return 1


def nucleus(sorted_probs: Tensor, top_p: float) -> Tensor:
    """Zero the probabilities [B, C] (sorted, descending, normalized) outside the top-p
    nucleus: a token goes when the tokens strictly more likely than it already hold top_p, so
    the first always stays and ties share one fate."""
    if top_p >= 1.0:
        return sorted_probs
    before = running_sum(sorted_probs) - sorted_probs  # [B, C] mass sorted ahead of each token
    # a tie run starts where the strictly larger values end; -sorted_probs is ascending
    run_start = torch.searchsorted(-sorted_probs, -sorted_probs, side="left")
    return sorted_probs.masked_fill(before.gather(-1, run_start) >= top_p, 0.0)


def invert(cdf: Tensor, u: Tensor) -> Tensor:
    """Indices [B, K] under cumulative sums cdf [B, V] (unnormalized) for uniforms u [B, K].

    `torch.multinomial` draws an exponential variate for every entry of the [B, V] table and
    took a third of each decoding step; this takes one uniform per draw. Entries of zero
    probability are never picked: their cumulative mass equals their predecessor's.
    """
    index = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return index.clamp_(max=cdf.shape[-1] - 1)


def sample_from(probs: Tensor, u: Tensor) -> Tensor:
    """One index per row [B] from unnormalized probs [B, V] and one uniform per row u [B, 1]."""
    return invert(running_sum(probs), u).squeeze(-1)


def mass_ahead(probs: Tensor, tokens: Tensor) -> Tensor:
    """The mass [B, K] of the tokens strictly more likely than each of tokens [B, K] under
    unnormalized probs [B, V]."""
    chosen = probs.gather(-1, tokens)  # [B, K]
    # 1.0 where strictly more likely, else 0.0; float arithmetic is several times faster here
    # than a boolean mask (torch.where or a bool product over [B, V])
    more_likely = (probs[:, None, :] - chosen[..., None]).sign_().clamp_(min=0.0)  # [B, K, V]
    return (probs[:, None, :] * more_likely).sum(-1)


def _sample_sorted(values: Tensor, ids: Tensor, top_p: float, u: Tensor) -> Tensor:
    """Token ids [B] drawn with uniforms u [B, 1] from the top-p nucleus of sorted
    (descending) probs values [B, C] whose token ids are `ids` [B, C]."""
    values = values / values.sum(-1, keepdim=True)
    choice = sample_from(nucleus(values, top_p), u)
    return ids.gather(-1, choice[:, None]).squeeze(-1)


def _sorted_fallback(probs: Tensor, top_p: float, u: Tensor) -> Tensor:
    """The nucleus draw by a full (stable) sort, with uniforms u [B, 1]."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    return _sample_sorted(sorted_probs, order, top_p, u)


def sample_nucleus(probs: Tensor, top_p: float, u: Tensor) -> Tensor:
    """One token per row [B] from the top-p nucleus of unnormalized probs [B, V], unsorted,
    with uniforms u [B, NUCLEUS_DRAWS + 1]; for the eager path: rows are redrawn only while
    they need it (a host synchronisation per redraw).

    A draw from the whole distribution that lands in the nucleus is a draw from the
    renormalized nucleus, and it lands there with probability at least top_p; so drawing
    until it does is exact and costs a few passes over the vocabulary, where the usual full
    sort took most of each decoding step at vocabularies in the thousands. Draw d uses
    u[:, d]; a row none of whose draws lands in the nucleus is drawn by a sort with the last.
    """
    cdf = running_sum(probs)  # [B, V]
    limit = top_p * cdf[:, -1:]  # [B, 1]
    tokens = invert(cdf, u[:, :1])  # [B, 1]
    pending = torch.nonzero(mass_ahead(probs, tokens)[:, 0] >= limit[:, 0]).squeeze(-1)
    for draw in range(1, NUCLEUS_DRAWS):
        if not len(pending):
            return tokens.squeeze(-1)
        draws = invert(cdf[pending], u[pending, draw : draw + 1])
        tokens[pending] = draws
        pending = pending[mass_ahead(probs[pending], draws)[:, 0] >= limit[pending, 0]]
    if len(pending):
        tokens[pending, 0] = _sorted_fallback(probs[pending], top_p, u[pending, -1:])
    return tokens.squeeze(-1)


def sample_nucleus_static(probs: Tensor, top_p: float, u: Tensor) -> Tensor:
    """What `sample_nucleus` draws, with fixed shapes and no host synchronisation, for a
    compiled or graph-captured step: every draw is made and checked at once and the sort
    always taken, the first draw that lands in the nucleus kept."""
    cdf = running_sum(probs)  # [B, V]
    candidates = invert(cdf, u[:, :NUCLEUS_DRAWS])  # [B, D]
    landed = mass_ahead(probs, candidates) < top_p * cdf[:, -1:]  # [B, D]
    first = landed.long().argmax(dim=-1, keepdim=True)  # the first True (or 0 where none)
    drawn = candidates.gather(-1, first).squeeze(-1)
    return torch.where(landed.any(-1), drawn, _sorted_fallback(probs, top_p, u[:, -1:]))


def choose_from_probs(
    probs: Tensor, config: SamplingConfig, u: Tensor, static: bool = False
) -> Tensor:
    """Next token ids [B] from unnormalized probs [B, V] (temperature already applied) and
    uniforms u [B, draws_per_step]; zero-probability tokens are never chosen. Top-k keeps the
    k most likely tokens (ties at the k-th place broken by `torch.topk`), then top-p applies
    within them. `static`: fixed shapes throughout (the same tokens)."""
    if config.greedy:
        return probs.argmax(dim=-1)
    if 0 < config.top_k < probs.shape[-1]:
        values, ids = torch.topk(probs, config.top_k, dim=-1)  # sorted, descending
        return _sample_sorted(values, ids, config.top_p, u)  # top-p of the top k
    if config.top_p >= 1.0:
        return sample_from(probs, u)
    nucleus_draw = sample_nucleus_static if static else sample_nucleus
    return nucleus_draw(probs, config.top_p, u)
