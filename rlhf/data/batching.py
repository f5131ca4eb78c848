"""Token sequences into padded batches: one padder per side.

Right padding keeps the fast causal path for training and scoring (real tokens never attend to
the pads that follow them); left padding lines prompts up on their last token for generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf.tokenizer.chat import Example

IGNORE_INDEX = -100  # target of positions the LM loss skips


def right_pad(sequences: Sequence[Sequence[int]], pad_value: int, width: int = 0) -> Tensor:
    """Ids [B, W] with each sequence left-aligned; W is the longest length (at least `width`)."""
    width = max(width, *(len(s) for s in sequences))
    ids = torch.full((len(sequences), width), pad_value, dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return ids


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


def collate(examples: Sequence[Example], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-padded inputs [B, T] and next-token targets [B, T].

    Targets are IGNORE_INDEX except on response tokens and the end token, so the loss teaches
    the answer and when to stop, never the prompt.
    """
    inputs = right_pad([e.ids[:-1] for e in examples], pad_id)
    targets = right_pad(
        [[IGNORE_INDEX] * (e.response_start - 1) + e.ids[e.response_start :] for e in examples],
        IGNORE_INDEX,
        width=inputs.shape[1],
    )
    return inputs, targets


@dataclass(frozen=True)
class SequenceBatch:
    """Whole chat sequences, right-padded, for scoring (reward model) and log-probs (DPO)."""

    ids: Tensor  # [B, T] `<|prompt|> p <|response|> r <|endoftext|>` then padding
    lengths: Tensor  # [B] real tokens per row; the end token sits at lengths - 1
    response_start: Tensor  # [B] index of each row's first response token


def sequence_batch(examples: Sequence[Example], pad_id: int) -> SequenceBatch:
    return SequenceBatch(
        ids=right_pad([e.ids for e in examples], pad_id),
        lengths=torch.tensor([len(e.ids) for e in examples]),
        response_start=torch.tensor([e.response_start for e in examples]),
    )
