"""Random numbers for sampling: one shared generator, or one stream per row of the batch.

A shared `torch.Generator` hands each decoding step's uniforms to the rows in batch order, so
what a row samples depends on which rows share its batch. RL rollouts are sampled in shares
across data-parallel ranks and must be the rollouts one process samples: there every row has
its own seeded stream (`RowStreams`), and its i-th draw is the same in any batch.

A generation draws every uniform it may use up front, as one table moved to the device once
(`uniform_table`): a decoding step then reads its column of the table, with no host work and
no host-to-device copy, which is what lets a GPU run the steps back to back (or replay them as
a CUDA graph).
"""

from __future__ import annotations

import torch
from torch import Tensor

SEED_LIMIT = 2**62  # row seeds are drawn below this: any torch generator takes them


class RowStreams:
    """A seeded stream of uniforms for each row of a batch; each row's draws come in order
    from its own stream, whichever rows are drawn for together. The streams run on the CPU,
    so a seed samples the same tokens on any device."""

    def __init__(self, seeds: list[int]) -> None:
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]

    def take(self, count: int) -> Tensor:
        """The next `count` uniforms of every row's stream, [B, count] on the CPU."""
        return torch.stack([torch.rand(count, generator=g) for g in self.generators])


RandomSource = torch.Generator | RowStreams | None


def shared_generator(source: torch.Generator | None, device: torch.device) -> torch.Generator:
    """`source`, or where it is None the default generator of `device` that it stands for."""
    if source is not None:
        return source
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index or torch.cuda.current_device()]
    return torch.default_generator


def uniform_table(
    source: RandomSource, batch: int, steps: int, draws: int, device: torch.device
) -> Tensor:
    """Uniforms [B, steps, draws] for `steps` decoding steps that take `draws` each per row,
    on `device`: from each row's own stream, or from a shared generator step by step, each
    step's draws row by row (the order in which drawing at each step would take them)."""
    if isinstance(source, RowStreams):
        return source.take(steps * draws).view(batch, steps, draws).to(device)
    generator = shared_generator(source, device)
    table = torch.rand(steps, draws, batch, generator=generator, device=generator.device)
    return table.permute(2, 0, 1).to(device)


def settle(generator: torch.Generator, state: Tensor, count: int) -> None:
    """Leave a shared `generator`, whose state before `uniform_table` was `state`, as if only
    `count` uniforms had been drawn (the decoding steps that sampled): a generation that ends
    early then leaves it where step-by-step draws did, so the next batch draws what it always
    drew."""
    generator.set_state(state)
    torch.rand(count, generator=generator, device=generator.device)
