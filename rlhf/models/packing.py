"""Padding-free forwards: the real tokens of a padded batch packed back to back.

A rollout row is mostly padding: prompts are left-padded to the longest prompt and responses
right-padded to the longest response. On the default config 60% of a [64, 45] rollout's
positions are padding, and every layer pays for them in the rollout's scoring forwards and in
each of PPO's update epochs. Packing lays the rows' real tokens one after another in bins of at
most `capacity` tokens. A block-diagonal causal mask keeps each row to its own tokens, and
positions restart at every row, so each real token gets the hidden state the padded forward
gives it (up to float rounding) at the cost of the real tokens alone. On CUDA in half
precision the bins run as one flat stream through varlen attention instead
(`rlhf.models.attention`): each row attends to its own tokens with no mask at all.

Where the host already holds the rows' lengths (the RL update reads them once per rollout),
packing waits on the device for nothing: the bins are laid out on the host, copied over
without blocking, and the tokens scattered into them without boolean indexing (whose output
size the host would have to wait for). One packing serves every model that forwards the same
rows: the policy, the reference, the critic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rlhf.models.attention import Segments
from rlhf.train.device import to_device

if TYPE_CHECKING:
    from rlhf.models.backbone import Backbone

# Most tokens of one bin: its attention costs its length squared, so bins stay near one
# context window even for models with long ones.
MAX_BIN_TOKENS = 1024


@dataclass(frozen=True)
class Packing:
    ids: Tensor  # [S, L] the rows' real tokens back to back in S bins, 0 after a bin's last row
    segments: Tensor  # [S, L] the row each packed token belongs to; -1 for a bin's padding
    source: Tensor  # [B, T] index into the flattened [S * L] of each real token; 0 at padding
    runs: Segments  # of the flattened [S * L] stream: each row, each bin's trailing padding


def bin_capacity(model: Backbone, lengths: Sequence[int]) -> int:
    """Most tokens one bin of `model`'s forward holds: about a context window, and at least
    the longest row."""
    return max(max(lengths), min(model.max_seq_len, MAX_BIN_TOKENS))


def packed_rows(model: Backbone, ids: Tensor, real: Tensor, lengths: Sequence[int]) -> Packing:
    """The packing of ids [B, T] for `model`'s forwards (and any model of its context),
    `lengths` [B] the count of each row's real tokens, held on the host."""
    return pack(ids, real, bin_capacity(model, lengths), lengths)


def pack(ids: Tensor, real: Tensor, capacity: int, lengths: Sequence[int]) -> Packing:
    """Pack the tokens of ids [B, T] where `real` [B, T] is True (`lengths` of them in each
    row, known on the host), row by row, into bins of at most `capacity` tokens (a longer row
    gets a bin of its own), first fit in decreasing order of length."""
    fills: list[int] = []  # tokens in each bin so far
    bin_of, offset = [0] * len(lengths), [0] * len(lengths)
    for row in sorted(range(len(lengths)), key=lambda r: -lengths[r]):
        bin_ = next((b for b, f in enumerate(fills) if f + lengths[row] <= capacity), len(fills))
        if bin_ == len(fills):
            fills.append(0)
        bin_of[row], offset[row] = bin_, fills[bin_]
        fills[bin_] += lengths[row]
    width = max(fills)
    size = len(fills) * width
    starts = [b * width + o for b, o in zip(bin_of, offset, strict=True)]
    padding = [b * width + f for b, f in enumerate(fills) if f < width]
    runs = sorted({0, *starts, *padding, size})  # a row of no tokens makes no run
    start = to_device(torch.tensor(starts), ids.device)
    target = start[:, None] + real.long().cumsum(-1) - 1  # [B, T] flat packed index
    rows = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(ids)
    # every token scattered, padding into one spare slot past the bins, dropped after
    into = torch.where(real, target, size).flatten()  # [B * T]
    packed_ids = ids.new_zeros(size + 1).scatter_(0, into, ids.flatten())[:size]
    segments = ids.new_full((size + 1,), -1).scatter_(0, into, rows.flatten())[:size]
    return Packing(
        ids=packed_ids.view(len(fills), width),
        segments=segments.view(len(fills), width),
        source=torch.where(real, target, 0),
        # the capacity bounds every run (and stays the same from batch to batch, so compiled
        # blocks do not recompile for it) unless a row longer than it has a bin of its own
        runs=Segments(
            to_device(torch.tensor(runs, dtype=torch.int32), ids.device), max(capacity, width)
        ),
    )


def bin_mask(segments: Tensor) -> Tensor:
    """Attention mask [S, 1, L, L] (True = attend: earlier tokens of the same row) for
    packed `segments` [S, L]."""
    length = segments.shape[1]
    same = segments[:, :, None] == segments[:, None, :]  # [S, L, L]
    causal = torch.ones(length, length, dtype=torch.bool, device=segments.device).tril()
    return (same & causal)[:, None]


def positions(segments: Tensor) -> Tensor:
    """Positions [S, L] of packed `segments` [S, L]: counting from 0 at each row's first
    token."""
    columns = torch.arange(segments.shape[1], device=segments.device).expand_as(segments)
    first = torch.ones_like(segments, dtype=torch.bool)
    first[:, 1:] = segments[:, 1:] != segments[:, :-1]
    row_start = torch.where(first, columns, 0).cummax(-1).values
    return torch.where(segments >= 0, columns - row_start, 0)


def packed_hidden_states(
    model: Backbone, ids: Tensor, real: Tensor, packing: Packing | None = None
) -> Tensor:
    """Final hidden states [B, T, C] of ids [B, T] at the real tokens (zero at padding), from
    one padding-free forward: what `model.hidden_states(ids, real)` gives, minus the cost of
    the padding. `packing`: the rows' packing (`packed_rows`), made here when not given."""
    if packing is None:
        packing = packed_rows(model, ids, real, real.sum(-1).tolist())
    hidden = model.packed_hidden_states(packing)  # [S, L, C]
    gathered = hidden.flatten(0, 1)[packing.source]  # [B, T, C]
    return torch.where(real[..., None], gathered, 0.0)
