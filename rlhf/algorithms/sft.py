"""Supervised fine-tuning: next-token cross-entropy on the demonstrations' responses only."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlhf.algorithms.lm_loss import chunk_terms, compiled_chunk_terms, linear_cross_entropy
from rlhf.data.batching import IGNORE_INDEX, collate
from rlhf.models.backbone import Backbone
from rlhf.tokenizer.chat import Example
from rlhf.train.device import to_device


def masked_lm_loss(model: Backbone, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the targets that are not IGNORE_INDEX, the LM head
    run a chunk of tokens at a time (`rlhf.algorithms.lm_loss`): never [B, T, V] logits."""
    hidden = model.hidden_states(inputs)  # [B, T, C]
    terms = compiled_chunk_terms() if model.compiled_blocks is not None else chunk_terms
    weight, vocab = model.head_weight(targets.numel())  # [V', C], padded on CUDA
    return linear_cross_entropy(hidden.flatten(0, 1), weight, targets.flatten(), terms, vocab)


def batch_loss(
    model: Backbone, examples: Sequence[Example], pad_id: int
) -> tuple[torch.Tensor, int]:
    """The LM loss of one batch of demonstrations, and the real tokens it forwarded (counted
    on the host: no wait on the device)."""
    device = next(model.parameters()).device
    inputs, targets = collate(examples, pad_id)
    tokens = int((inputs != pad_id).sum())
    return masked_lm_loss(model, to_device(inputs, device), to_device(targets, device)), tokens


@torch.no_grad()
def validation_loss(
    model: Backbone, examples: Sequence[Example], pad_id: int, batch_size: int
) -> float:
    """Mean cross-entropy per response token over the whole set."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(examples), batch_size):
        inputs, targets = collate(examples[start : start + batch_size], pad_id)
        inputs, targets = inputs.to(device), targets.to(device)
        tokens = int((targets != IGNORE_INDEX).sum())
        total += float(masked_lm_loss(model, inputs, targets)) * tokens
        count += tokens
    return total / count
