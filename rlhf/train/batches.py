"""What every training loop does with its batches, SFT's and RL's alike: the seeded order it
takes examples in, and reading a step's numbers off the device at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def read_together(*values: float | Tensor) -> list[float]:
    """Values some of which are on the device, read in one transfer: a step waits on the
    device once, not once per value."""
    on_device = [v.detach().float().reshape(()) for v in values if isinstance(v, Tensor)]
    read = iter(torch.stack(on_device).tolist() if on_device else [])
    return [next(read) if isinstance(v, Tensor) else v for v in values]


# Batches are cut from windows of this many batches sorted by length: enough to make batches
# nearly pad-free, few enough that each epoch still mixes the whole set.
BUCKET_WINDOW = 50


def batch_order(
    n_examples: int,
    seed: int,
    epoch: int,
    lengths: Sequence[int] | None = None,
    batch_size: int = 1,
) -> list[int]:
    """A seeded shuffle of the examples; with `lengths`, batches of similar length.

    Short answers padded to the longest ramble in a random batch waste over half of every
    forward pass. Bucketing sorts shuffled windows by length, cuts them into batches and
    shuffles the batches; the last, partial batch stays last so every slice of `batch_size`
    is one batch. A pure function of (seed, epoch), so a resumed run sees the same batches.
    """
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(n_examples, generator=generator).tolist()
    if lengths is None:
        return order
    window = batch_size * BUCKET_WINDOW
    order = [
        i
        for start in range(0, n_examples, window)
        for i in sorted(order[start : start + window], key=lambda i: lengths[i])
    ]
    n_full = n_examples // batch_size
    batches = [order[b * batch_size : (b + 1) * batch_size] for b in range(n_full)]
    shuffled = [batches[b] for b in torch.randperm(n_full, generator=generator).tolist()]
    return [i for batch in shuffled for i in batch] + order[n_full * batch_size :]
