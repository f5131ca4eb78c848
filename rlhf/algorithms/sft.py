"""Supervised fine-tuning: next-token cross-entropy on the demonstrations' responses only."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from rlhf.data.batching import IGNORE_INDEX, collate
from rlhf.data.chat import Example
from rlhf.models.backbone import Backbone


def masked_lm_loss(model: Backbone, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the targets that are not IGNORE_INDEX."""
    logits = model(inputs)  # [B, T, V]
    return F.cross_entropy(
        logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX
    )


def batch_loss(
    model: Backbone, examples: Sequence[Example], pad_id: int
) -> tuple[torch.Tensor, int]:
    """The LM loss of one batch of demonstrations, and the real tokens it forwarded."""
    device = next(model.parameters()).device
    inputs, targets = (t.to(device) for t in collate(examples, pad_id))
    return masked_lm_loss(model, inputs, targets), int((inputs != pad_id).sum())


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
