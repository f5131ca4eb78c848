"""Choosing the next token from a distribution: greedy, temperature, top-k and exact top-p.

The top-p nucleus follows one rule on every path: a token is in the nucleus when the tokens
strictly more likely than it hold less than `top_p` of the mass. Tied tokens are therefore in
or out together, whichever order a sort happens to put them in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf.sampling.streams import RandomSource, uniforms


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


# Nucleus draws rejected this many times in a row fall back to a full sort; with top_p = 0.9 a
# row gets there with probability 1e-16.
MAX_NUCLEUS_DRAWS = 16


def nucleus(sorted_probs: Tensor, top_p: float) -> Tensor:
    """Zero the probabilities [B, C] (sorted, descending, normalized) outside the top-p
    nucleus: a token goes when the tokens strictly more likely than it already hold top_p, so
    the first always stays and ties share one fate."""
    if top_p >= 1.0:
        return sorted_probs
    before = sorted_probs.cumsum(-1) - sorted_probs  # [B, C] mass sorted ahead of each token
    # a tie run starts where the strictly larger values end; -sorted_probs is ascending
    run_start = torch.searchsorted(-sorted_probs, -sorted_probs, side="left")
    return sorted_probs.masked_fill(before.gather(-1, run_start) >= top_p, 0.0)


def sample_from(probs: Tensor, source: RandomSource, rows: Tensor | None = None) -> Tensor:
    """One index per row [B] from unnormalized probs [B, V] by inverting the cumulative sum;
    `rows` are the batch rows these are (None: all), for a source with a stream per row.

    `torch.multinomial` draws an exponential variate for every entry of the [B, V] table and
    took a third of each decoding step; this draws one uniform per row. Entries of zero
    probability are never picked: their cumulative mass equals their predecessor's.
    """
    return _invert(probs.cumsum(dim=-1), source, rows)


def _invert(cdf: Tensor, source: RandomSource, rows: Tensor | None) -> Tensor:
    """Indices [B] for one uniform per row under cumulative sums cdf [B, V]."""
    u = uniforms(source, cdf.shape[0], rows, cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


def in_nucleus(probs: Tensor, tokens: Tensor, limit: Tensor) -> Tensor:
    """Whether each row's token [B] is in the top-p nucleus of unnormalized probs [B, V]: the
    mass of the strictly more likely tokens is below `limit` [B], top_p times the row's total."""
    chosen = probs.gather(-1, tokens[:, None])  # [B, 1]
    # 1.0 where strictly more likely, else 0.0; float arithmetic is several times faster here
    # than a boolean mask (torch.where or a bool product over [B, V])
    more_likely = (probs - chosen).sign_().clamp_(min=0.0)
    return (probs * more_likely).sum(-1) < limit


def _sample_sorted(
    values: Tensor, ids: Tensor, top_p: float, source: RandomSource, rows: Tensor | None = None
) -> Tensor:
    """Token ids [B] drawn from the top-p nucleus of sorted (descending) probs values [B, C]
    whose token ids are `ids` [B, C]."""
    values = values / values.sum(-1, keepdim=True)
    choice = sample_from(nucleus(values, top_p), source, rows)
    return ids.gather(-1, choice[:, None]).squeeze(-1)


def sample_nucleus(probs: Tensor, top_p: float, source: RandomSource) -> Tensor:
    """One token per row [B] from the top-p nucleus of unnormalized probs [B, V], unsorted.

    A draw from the whole distribution that lands in the nucleus is a draw from the
    renormalized nucleus, and it lands there with probability at least top_p; so drawing
    until it does is exact and costs a few passes over the vocabulary, where the usual full
    sort took most of each decoding step at vocabularies in the thousands.
    """
    cdf = probs.cumsum(dim=-1)  # [B, V]
    limit = top_p * cdf[:, -1]  # [B]
    tokens = _invert(cdf, source, None)
    pending = torch.nonzero(~in_nucleus(probs, tokens, limit)).squeeze(-1)
    for _ in range(MAX_NUCLEUS_DRAWS):
        if not len(pending):
            return tokens
        draws = _invert(cdf[pending], source, pending)
        tokens[pending] = draws
        pending = pending[~in_nucleus(probs[pending], draws, limit[pending])]
    if len(pending):
        sorted_probs, order = torch.sort(probs[pending], dim=-1, descending=True)
        tokens[pending] = _sample_sorted(sorted_probs, order, top_p, source, pending)
    return tokens


def choose_from_probs(probs: Tensor, config: SamplingConfig, source: RandomSource) -> Tensor:
    """Next token ids [B] from unnormalized probs [B, V] (temperature already applied);
    zero-probability tokens are never chosen. Top-k keeps the k most likely tokens (ties at
    the k-th place broken by `torch.topk`), then top-p applies within them."""
    if config.greedy:
        return probs.argmax(dim=-1)
    if config.top_k and config.top_k < probs.shape[-1]:
        values, ids = torch.topk(probs, config.top_k, dim=-1)  # sorted, descending
        return _sample_sorted(values, ids, config.top_p, source)  # top-p of the top k
    if config.top_p >= 1.0:
        return sample_from(probs, source)
    return sample_nucleus(probs, config.top_p, source)
