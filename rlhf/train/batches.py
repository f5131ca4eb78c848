"""What every training loop does with its batches, SFT's and RL's alike: the seeded order it
takes examples in, and reading a step's numbers off the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Readback:
    """Numbers on their way from the device to the host. On CUDA the copy is queued into
    pinned memory with an event after it, so `read` waits for the work queued before it, not
    for what the host has queued since (the next step)."""

    host: Tensor  # [n] float32; pinned on CUDA
    copied: torch.cuda.Event | None  # None off CUDA, where the copy is done at once

    @classmethod
    def of(cls, values: Tensor) -> Readback:
        """Start reading `values` [n]."""
        values = values.detach().float()
        if values.device.type != "cuda":
            return cls(values.cpu(), None)
        host = torch.empty(values.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(values, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return cls(host, copied)

    def read(self) -> list[float]:
        if self.copied is not None:
            self.copied.synchronize()
        return self.host.tolist()


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
