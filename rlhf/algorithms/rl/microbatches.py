"""A minibatch's rows cut into microbatches by a token budget, the same number on every rank.

The optimizer's minibatch is an algorithm's choice (how many answers one step averages over);
how many tokens one forward and backward pass can hold is the device's. The update runs a
minibatch as microbatches of at most `rl.microbatch_tokens` real tokens each, adding their
gradients before its one optimizer step, and the scoring pass runs a rollout the same way.
Every rank runs as many microbatches as the rank that needs most (a sharded model gathers its
blocks in every forward, a collective all ranks must join): a rank with fewer fills them with
a stand-in row that counts for nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf.models.backbone import Backbone
from rlhf.models.packing import Packing, packed_rows
from rlhf.sampling.rollout import Rollout
from rlhf.train.device import to_device
from rlhf.train.distributed import World


@dataclass(frozen=True)
class Microbatch:
    rows: list[int]  # rollout rows
    counts: bool  # False: a stand-in, forwarded so that every rank runs alike; weigh it 0


def cut(rows: Sequence[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    """`rows` in order, in consecutive groups of at most `budget` tokens (`lengths` per row);
    a row longer than the budget alone."""
    groups: list[list[int]] = []
    tokens = 0
    for row in rows:
        if not groups or tokens + lengths[row] > budget:
            groups.append([])
            tokens = 0
        groups[-1].append(row)
        tokens += lengths[row]
    return groups


def microbatches(
    world: World, rows: list[int], lengths: Sequence[int], budget: int
) -> list[Microbatch]:
    """This rank's share of `rows` (`World.shard`) cut by `budget`, padded with stand-ins to
    the count of the rank that needs most (every rank knows every rank's share)."""
    count = max(len(cut(share, lengths, budget)) for share in world.shares(rows))
    mine, holds_rows = world.shard(rows)
    groups = cut(mine, lengths, budget) if holds_rows else []
    return [Microbatch(g, True) for g in groups] + [Microbatch(mine[:1], False)] * (
        count - len(groups)
    )


@dataclass(frozen=True)
class Forwarded:
    """Some rollout rows as every model forwards them: the rows [b], their ids and real
    tokens [b, T], and their packing, laid out once from lengths the host holds and shared
    by the models (policy, reference, critic), so none of their forwards waits on the
    device."""

    rows: Tensor  # [b] indices into the rollout
    ids: Tensor  # [b, T]
    real: Tensor  # [b, T] True on real tokens
    packing: Packing


def forwarded(
    rollout: Rollout, rows: Sequence[int], lengths: Sequence[int], model: Backbone
) -> Forwarded:
    """`rows` of `rollout` (`lengths`: every row's real tokens, on the host), packed for
    `model`'s forwards and any of its context."""
    index = to_device(torch.tensor(list(rows)), rollout.sequences.device)
    ids, real = rollout.sequences[index], rollout.attention_mask[index]
    return Forwarded(index, ids, real, packed_rows(model, ids, real, [lengths[r] for r in rows]))
