"""Reward model: K-way ranking loss, pooling, and batched scoring.

InstructGPT trains on all C(K,2) comparisons of a prompt as one batch element: each of the K
responses is forwarded once and every pair reuses those K rewards. Forwarding each pair on its
own would run every response K-1 times and overfit to responses that recur across pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import torch
import torch.nn.functional as F
from torch import Tensor

from rlhf.data import Example, encode_example
from rlhf.model import GPT
from rlhf.tokenizer import Tokenizer


@dataclass(frozen=True)
class Pairs:
    """Comparisons among the rows of one flattened batch of responses."""

    better: Tensor  # [P] row index of the preferred response
    worse: Tensor  # [P] row index of the other one
    weight: Tensor  # [P] 1 / (C(K,2) of its prompt * prompts): each prompt weighs the same


def ranking_pairs(
    ranks: Sequence[Sequence[int]], rows: Sequence[Sequence[int]] | None = None
) -> Pairs:
    """Pairs of every prompt's responses, rows numbered across the flattened batch.

    `ranks[g][i]` is the rank of response i of prompt g, 0 = best. Equal ranks give no pair.
    `rows[g][i]` is the batch row, counted within prompt g, that holds response i: a response
    sampled twice is forwarded once and its pairs point at one row (by default each response
    has its own row). The loss is unchanged; a pair of two copies has margin 0 and no gradient.
    """
    better, worse, weight = [], [], []
    offset = 0
    for g, group in enumerate(ranks):
        row_of = rows[g] if rows is not None else range(len(group))
        group_pairs = [
            (i, j) if group[i] < group[j] else (j, i)
            for i, j in combinations(range(len(group)), 2)
            if group[i] != group[j]
        ]
        for b, w in group_pairs:
            better.append(offset + row_of[b])
            worse.append(offset + row_of[w])
            weight.append(1.0 / (len(group_pairs) * len(ranks)))
        offset += max(row_of, default=-1) + 1
    return Pairs(
        better=torch.tensor(better, dtype=torch.long),
        worse=torch.tensor(worse, dtype=torch.long),
        weight=torch.tensor(weight),
    )


def ranking_loss(rewards: Tensor, pairs: Pairs) -> Tensor:
    """Mean over prompts of the mean over their pairs of -log sigmoid(r_better - r_worse)."""
    margin = rewards[pairs.better.to(rewards.device)] - rewards[pairs.worse.to(rewards.device)]
    return -(F.logsigmoid(margin) * pairs.weight.to(rewards.device)).sum()


@dataclass(frozen=True)
class RewardBatch:
    ids: Tensor  # [B, T] right-padded `<|prompt|> p <|response|> r <|endoftext|>`
    lengths: Tensor  # [B] real tokens per row; the end token sits at lengths - 1
    response_start: Tensor  # [B] index of each row's first response token


def pad_examples(examples: Sequence[Example], pad_id: int) -> RewardBatch:
    """Right-pad tokenized sequences into one batch."""
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    for row, example in enumerate(examples):
        ids[row, : len(example.ids)] = torch.tensor(example.ids)
    return RewardBatch(
        ids=ids,
        lengths=torch.tensor([len(e.ids) for e in examples]),
        response_start=torch.tensor([e.response_start for e in examples]),
    )


def reward_batch(
    tokenizer: Tokenizer, prompts: Sequence[str], responses: Sequence[str], block_size: int
) -> RewardBatch:
    examples = [
        encode_example(tokenizer, p, r, block_size) for p, r in zip(prompts, responses, strict=True)
    ]
    return pad_examples(examples, tokenizer.pad_id)


def pooled_rewards(model: GPT, batch: RewardBatch, pooling: str) -> Tensor:
    """One scalar reward per row [B]: at the end token (`last`) or the mean over the response.

    Right padding needs no attention mask: real tokens never attend to the pads after them.
    """
    device = next(model.parameters()).device
    per_token = model.rewards(model.hidden(batch.ids.to(device))).float()  # [B, T]
    lengths = batch.lengths.to(device)
    if pooling == "last":
        return per_token.gather(1, (lengths - 1)[:, None]).squeeze(1)
    positions = torch.arange(per_token.shape[1], device=device)[None]
    in_response = (positions >= batch.response_start.to(device)[:, None]) & (
        positions < lengths[:, None]
    )
    return (per_token * in_response).sum(1) / in_response.sum(1)


@torch.no_grad()
def score(
    model: GPT,
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
        batch = reward_batch(
            tokenizer,
            [prompts[i] for i in rows],
            [responses[i] for i in rows],
            model.config.block_size,
        )
        rewards[rows] = pooled_rewards(model, batch, pooling).cpu()
    return rewards


def normalize_head(model: GPT, reference_rewards: Tensor) -> tuple[float, float]:
    """Shift the reward head's bias so the reference responses average 0; return (shift, std).

    InstructGPT normalizes its RM so labeler demonstrations score 0 on average; PPO uses the
    recorded std to put rewards from different reward models on one scale.
    """
    shift = float(reference_rewards.mean())
    with torch.no_grad():
        model.reward_head.bias -= shift
    return shift, float(reference_rewards.std())
