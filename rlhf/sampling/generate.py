"""Batched sampling with a KV cache over left-padded prompts.

Left padding puts every prompt's last token in the same column, so one forward per step serves
the whole batch and each row's cache grows by one token. Finished rows keep emitting the pad id.
The pipeline's own tokenizers pad with a token of their own (a model trained with pad == end
learns never to stop); a pretrained one without a pad token (GPT-2's) pads with its end token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf.data.batching import left_pad
from rlhf.data.chat import decode_response, prompt_ids
from rlhf.data.tokenizer import Tokenizer
from rlhf.models.backbone import Backbone
from rlhf.sampling.sampler import SamplingConfig, choose_from_probs
from rlhf.sampling.streams import RandomSource


@dataclass
class Generation:
    prompt: Tensor  # [B, P] left-padded prompt ids
    prompt_mask: Tensor  # [B, P] True for real prompt tokens
    tokens: Tensor  # [B, N] response ids; pad after the end token
    mask: Tensor  # [B, N] True for response tokens, the end token included
    logprobs: Tensor  # [B, N] log-prob of each token under the temperature-scaled logits
    ended: Tensor  # [B] True where the row emitted the end token


@torch.no_grad()
def generate(
    model: Backbone,
    prompts: Sequence[Sequence[int]],
    *,
    eos_id: int,
    pad_id: int,
    config: SamplingConfig,
    generator: RandomSource = None,
) -> Generation:
    """Sample responses for token-id prompts; prompts longer than the context keep their end.
    `generator`: a torch generator, or `RowStreams` with a stream for each prompt."""
    device = next(model.parameters()).device
    budget = model.max_seq_len - config.max_new_tokens
    if budget < 1:
        raise ValueError(
            f"max_new_tokens={config.max_new_tokens} leaves no room for a prompt in "
            f"a context of {model.max_seq_len} tokens"
        )
    prompt, prompt_mask = left_pad([list(p)[-budget:] for p in prompts], pad_id)
    prompt, prompt_mask = prompt.to(device), prompt_mask.to(device)
    batch = prompt.shape[0]
    cache = model.new_cache(batch, prompt.shape[1] + config.max_new_tokens, device)

    tokens = torch.full((batch, config.max_new_tokens), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((batch, config.max_new_tokens), dtype=torch.bool, device=device)
    logprobs = torch.zeros((batch, config.max_new_tokens), device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    # padding is no answer token, so it is never sampled; unless it is the end token itself
    unsampled = torch.tensor([pad_id] if pad_id != eos_id else [], dtype=torch.long, device=device)
    logits = model(prompt, prompt_mask, cache)[:, -1]
    for step in range(config.max_new_tokens):
        # log-probs under the policy itself (what a full forward pass recomputes)
        logp = (logits.float() / config.temperature).log_softmax(dim=-1)  # [B, V]
        next_token = choose_from_probs(
            logp.exp().index_fill_(-1, unsampled, 0.0), config, generator
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
        ended=((tokens == eos_id) & mask).any(dim=-1),
    )


def generate_texts(
    model: Backbone,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    config: SamplingConfig,
    *,
    batch_size: int = 64,
    generator: torch.Generator | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> list[str]:
    """Answer text prompts in batches of similar length; results keep the input order."""
    encoded = [prompt_ids(tokenizer, p) for p in prompts]
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
            answers[row] = decode_response(tokenizer, ids)
        if on_batch:
            on_batch(len(rows))
    return answers
