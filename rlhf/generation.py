"""Batched sampling with a KV cache over left-padded prompts.

Left padding puts every prompt's last token in the same column, so one forward per step serves
the whole batch and each row's cache grows by one token. Finished rows keep emitting the pad id,
which is distinct from the end token: a model trained with pad == end learns never to stop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf.model import GPT, KVCache
from rlhf.tokenizer import Tokenizer


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


@dataclass
class Generation:
    prompt: Tensor  # [B, P] left-padded prompt ids
    prompt_mask: Tensor  # [B, P] True for real prompt tokens
    tokens: Tensor  # [B, N] response ids; pad after the end token
    mask: Tensor  # [B, N] True for response tokens, the end token included
    logprobs: Tensor  # [B, N] log-prob of each token under the temperature-scaled logits
    lengths: Tensor  # [B] response tokens per row, the end token included
    ended: Tensor  # [B] True where the row emitted the end token


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Ids [B, L] and mask [B, L] with each sequence right-aligned."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = True
    return ids, mask


# Nucleus draws rejected this many times in a row fall back to a full sort; with top_p = 0.9 a
# row gets there with probability 1e-16.
MAX_NUCLEUS_DRAWS = 16


def nucleus(sorted_probs: Tensor, top_p: float) -> Tensor:
    """Zero the probabilities [B, C] (sorted, descending, normalized) outside the top-p
    nucleus: a token is dropped when the mass before it already reaches top_p, so the first
    always stays."""
    if top_p >= 1.0:
        return sorted_probs
    return sorted_probs.masked_fill(sorted_probs.cumsum(-1) - sorted_probs >= top_p, 0.0)


def sample_from(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One index per row [B] from unnormalized probs [B, V] by inverting the cumulative sum.

    `torch.multinomial` draws an exponential variate for every entry of the [B, V] table and
    took a third of each decoding step; this draws one uniform per row. Entries of zero
    probability are never picked: their cumulative mass equals their predecessor's.
    """
    return _invert(probs.cumsum(dim=-1), generator)


def _invert(cdf: Tensor, generator: torch.Generator | None) -> Tensor:
    """Indices [B] for one uniform per row under cumulative sums cdf [B, V]."""
    u = torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device) * cdf[:, -1:]
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
    values: Tensor, ids: Tensor, top_p: float, generator: torch.Generator | None
) -> Tensor:
    """Token ids [B] drawn from the top-p nucleus of sorted (descending) probs values [B, C]
    whose token ids are `ids` [B, C]."""
    values = values / values.sum(-1, keepdim=True)
    choice = sample_from(nucleus(values, top_p), generator)
    return ids.gather(-1, choice[:, None]).squeeze(-1)


def sample_nucleus(probs: Tensor, top_p: float, generator: torch.Generator | None) -> Tensor:
    """One token per row [B] from the top-p nucleus of unnormalized probs [B, V], unsorted.

    A draw from the whole distribution that lands in the nucleus is a draw from the
    renormalized nucleus, and it lands there with probability at least top_p; so drawing
    until it does is exact and costs a few passes over the vocabulary, where the usual full
    sort took most of each decoding step at vocabularies in the thousands.
    """
    cdf = probs.cumsum(dim=-1)  # [B, V]
    limit = top_p * cdf[:, -1]  # [B]
    tokens = _invert(cdf, generator)
    pending = torch.nonzero(~in_nucleus(probs, tokens, limit)).squeeze(-1)
    for _ in range(MAX_NUCLEUS_DRAWS):
        if not len(pending):
            return tokens
        draws = _invert(cdf[pending], generator)
        tokens[pending] = draws
        pending = pending[~in_nucleus(probs[pending], draws, limit[pending])]
    if len(pending):
        sorted_probs, order = torch.sort(probs[pending], dim=-1, descending=True)
        tokens[pending] = _sample_sorted(sorted_probs, order, top_p, generator)
    return tokens


def choose_from_probs(
    probs: Tensor, config: SamplingConfig, generator: torch.Generator | None
) -> Tensor:
    """Next token ids [B] from unnormalized probs [B, V] (temperature already applied);
    zero-probability tokens are never chosen."""
    if config.greedy:
        return probs.argmax(dim=-1)
    if config.top_k and config.top_k < probs.shape[-1]:
        values, ids = torch.topk(probs, config.top_k, dim=-1)  # sorted, descending
        return _sample_sorted(values, ids, config.top_p, generator)  # top-p of the top k
    if config.top_p >= 1.0:
        return sample_from(probs, generator)
    return sample_nucleus(probs, config.top_p, generator)


def choose_tokens(
    logits: Tensor, config: SamplingConfig, generator: torch.Generator | None
) -> Tensor:
    """Next token ids [B] from temperature-scaled logits [B, V]."""
    return choose_from_probs(logits.softmax(dim=-1), config, generator)


@torch.no_grad()
def generate(
    model: GPT,
    prompts: Sequence[Sequence[int]],
    *,
    eos_id: int,
    pad_id: int,
    config: SamplingConfig,
    generator: torch.Generator | None = None,
) -> Generation:
    """Sample responses for token-id prompts; prompts longer than the context keep their end."""
    device = next(model.parameters()).device
    budget = model.config.block_size - config.max_new_tokens
    if budget < 1:
        raise ValueError(
            f"max_new_tokens={config.max_new_tokens} leaves no room for a prompt in "
            f"block_size={model.config.block_size}"
        )
    prompt, prompt_mask = left_pad([list(p)[-budget:] for p in prompts], pad_id)
    prompt, prompt_mask = prompt.to(device), prompt_mask.to(device)
    batch = prompt.shape[0]
    cache = KVCache(model.config, batch, prompt.shape[1] + config.max_new_tokens, device)

    tokens = torch.full((batch, config.max_new_tokens), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((batch, config.max_new_tokens), dtype=torch.bool, device=device)
    logprobs = torch.zeros((batch, config.max_new_tokens), device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    pad_index = torch.tensor([pad_id], device=device)
    logits = model(prompt, prompt_mask, cache)[:, -1]
    for step in range(config.max_new_tokens):
        # log-probs under the policy itself (what a full forward pass recomputes); sampling
        # never picks padding, which is no answer token
        logp = (logits.float() / config.temperature).log_softmax(dim=-1)  # [B, V]
        next_token = choose_from_probs(
            logp.exp().index_fill_(-1, pad_index, 0.0), config, generator
        )
        token_logprob = logp.gather(-1, next_token[:, None]).squeeze(-1)
        active = ~finished
        tokens[:, step] = torch.where(active, next_token, pad_id)
        mask[:, step] = active
        logprobs[:, step] = torch.where(active, token_logprob, 0.0)
        finished = finished | (next_token == eos_id)
        if bool(finished.all()) or step + 1 == config.max_new_tokens:
            break
        logits = model(tokens[:, step : step + 1], active[:, None], cache)[:, -1]

    return Generation(
        prompt=prompt,
        prompt_mask=prompt_mask,
        tokens=tokens,
        mask=mask,
        logprobs=logprobs,
        lengths=mask.sum(dim=-1),
        ended=((tokens == eos_id) & mask).any(dim=-1),
    )


def generate_texts(
    model: GPT,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    config: SamplingConfig,
    *,
    batch_size: int = 64,
    generator: torch.Generator | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> list[str]:
    """Answer text prompts in batches of similar length; results keep the input order."""
    encoded = [tokenizer.encode_prompt(p) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
    answers = [""] * len(prompts)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        out = generate(
            model,
            [encoded[i] for i in rows],
            eos_id=tokenizer.eos_id,
            pad_id=tokenizer.pad_id,
            config=config,
            generator=generator,
        )
        for row, ids in zip(rows, out.tokens.tolist(), strict=True):
            answers[row] = tokenizer.decode_response(ids)
        if on_batch:
            on_batch(len(rows))
    return answers
