"""Reward model: InstructGPT's K-way ranking loss, pooling, batched scoring, normalization.

InstructGPT trains on all C(K,2) comparisons of a prompt as one batch element: each of the K
responses is forwarded once and every pair reuses those K rewards. Forwarding each pair on its
own would run every response K-1 times and overfit to responses that recur across pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from rlhf.data.batching import SequenceBatch, sequence_batch
from rlhf.data.comparisons import EncodedGroup, Pairs, ranking_pairs
from rlhf.models.backbone import Backbone
from rlhf.models.packing import packed_hidden_states
from rlhf.tokenizer.chat import encode_example
from rlhf.tokenizer.tokenizer import Tokenizer


def ranking_loss(rewards: Tensor, pairs: Pairs) -> Tensor:
    """Mean over prompts of the mean over their pairs of -log sigmoid(r_better - r_worse)."""
    margin = rewards[pairs.better.to(rewards.device)] - rewards[pairs.worse.to(rewards.device)]
    return -(F.logsigmoid(margin) * pairs.weight.to(rewards.device)).sum()


def pooled_rewards(model: Backbone, batch: SequenceBatch, pooling: str) -> Tensor:
    """One scalar reward per row [B]: at the end token (`last`) or the mean over the response,
    from a padding-free forward (the responses to one prompt differ in length)."""
    device = next(model.parameters()).device
    lengths = batch.lengths.to(device)
    positions = torch.arange(batch.ids.shape[1], device=device)[None]
    real = positions < lengths[:, None]  # [B, T]
    hidden = packed_hidden_states(model, batch.ids.to(device), real)
    per_token = model.rewards(hidden).float()  # [B, T]
    if pooling == "last":
        return per_token.gather(1, (lengths - 1)[:, None]).squeeze(1)
    in_response = (positions >= batch.response_start.to(device)[:, None]) & (
        positions < lengths[:, None]
    )
    return torch.where(in_response, per_token, 0.0).sum(1) / in_response.sum(1)


def group_loss(
    model: Backbone, groups: Sequence[EncodedGroup], pad_id: int, pooling: str
) -> tuple[Tensor, int]:
    """K-way loss of a batch of prompts: their responses in one forward, then all pairs; and
    the tokens forwarded."""
    batch = sequence_batch([e for g in groups for e in g.examples], pad_id)
    rewards = pooled_rewards(model, batch, pooling)
    return ranking_loss(rewards, ranking_pairs(groups)), int(batch.lengths.sum())


@torch.no_grad()
def mean_group_loss(
    model: Backbone, groups: Sequence[EncodedGroup], pad_id: int, pooling: str, chunk: int
) -> float:
    """group_loss over a whole set, `chunk` prompts per forward (each prompt weighs the same)."""
    total = 0.0
    for start in range(0, len(groups), chunk):
        part = groups[start : start + chunk]
        total += group_loss(model, part, pad_id, pooling)[0].item() * len(part)
    return total / len(groups)


@torch.no_grad()
def score(
    model: Backbone,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    responses: Sequence[str],
    *,
    pooling: str,
    batch_size: int = 256,
) -> Tensor:
    """Rewards [N] for (prompt, response) pairs, in batches of similar length."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(responses[i]))
    rewards = torch.empty(len(prompts))
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        examples = [
            encode_example(tokenizer, prompts[i], responses[i], model.max_seq_len) for i in rows
        ]
        batch = sequence_batch(examples, tokenizer.pad_id)
        rewards[rows] = pooled_rewards(model, batch, pooling).cpu()
    return rewards


def score_rows(
    model: Backbone,
    tokenizer: Tokenizer,
    rows: Sequence[dict[str, Any]],
    *,
    pooling: str,
    batch_size: int,
) -> list[list[float]]:
    """The reward of every ranked response, row by row."""
    flat = score(
        model,
        tokenizer,
        [r["prompt"] for r in rows for _ in r["responses"]],
        [x for r in rows for x in r["responses"]],
        pooling=pooling,
        batch_size=batch_size,
    ).tolist()
    out, offset = [], 0
    for r in rows:
        out.append(flat[offset : offset + len(r["responses"])])
        offset += len(r["responses"])
    return out


def normalize(model: Backbone, reference_rewards: Tensor) -> tuple[float, float]:
    """Shift the rewards so the reference responses average 0; return (shift, std).

    InstructGPT normalizes its RM so labeler demonstrations score 0 on average; RL uses the
    recorded std to put rewards from different reward models on one scale.
    """
    shift = float(reference_rewards.mean())
    model.shift_rewards(shift)
    return shift, float(reference_rewards.std())
