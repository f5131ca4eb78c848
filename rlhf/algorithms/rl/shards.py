"""A rollout sampled in shares across data-parallel ranks, whole again on every rank.

Each rank samples and scores its strided share of an iteration's rows (`World.shard`): the
expensive part, generation and the forwards of policy, reference, critic and reward model,
runs once per row. What that leaves per row is a few tokens' worth of numbers, so every rank
then gathers the whole batch and computes the rewards, advantages, whitening and statistics of
the global batch itself, exactly as one process does; the update then takes each rank's share
of every minibatch of it.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from rlhf.sampling.rollout import Rollout
from rlhf.tokenizer.chat import decode_response
from rlhf.tokenizer.tokenizer import Tokenizer
from rlhf.train.distributed import World, gather_rows, max_across


def widened(rollout: Rollout, prompt_width: int, pad_id: int) -> Rollout:
    """The rollout with its prompts left-padded to `prompt_width` columns."""
    extra = prompt_width - rollout.prompt_width
    rows = rollout.sequences.shape[0]
    pad = rollout.sequences.new_full((rows, extra), pad_id)
    hidden = rollout.attention_mask.new_zeros((rows, extra))
    return dataclasses.replace(
        rollout,
        sequences=torch.cat([pad, rollout.sequences], dim=1),
        attention_mask=torch.cat([hidden, rollout.attention_mask], dim=1),
        prompt_width=prompt_width,
    )


def whole_batch(
    world: World,
    prompts: list[str],
    share: Rollout,
    per_row: dict[str, Tensor],
    holds_rows: bool,
    tokenizer: Tokenizer,
) -> tuple[Rollout, dict[str, Tensor]]:
    """The rollout of all `prompts` (the global batch's rows) and the `per_row` tensors of
    every row, from this rank's `share` of them: laid out as one process samples them, every
    prompt left-padded to the widest. `holds_rows` False: this rank sampled a stand-in row
    (`World.shard`) that is not part of the batch."""
    if not world.distributed:
        return share, per_row
    device = share.sequences.device
    width = max_across(world, share.prompt_width, device)
    local = widened(share, width, tokenizer.pad_id)
    names = list(per_row)
    sequences, attention, response_mask, logprobs, ended, *values = gather_rows(
        world,
        [local.sequences, local.attention_mask, local.response_mask, local.logprobs,
         local.ended, *per_row.values()],
        len(share.prompts) if holds_rows else 0,
    )  # fmt: skip
    whole = Rollout(
        prompts=prompts,
        responses=[decode_response(tokenizer, ids) for ids in sequences[:, width:].tolist()],
        sequences=sequences,
        attention_mask=attention,
        response_mask=response_mask,
        logprobs=logprobs,
        ended=ended,
        prompt_width=width,
    )
    return whole, dict(zip(names, values, strict=True))
