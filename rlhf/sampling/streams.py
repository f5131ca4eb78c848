"""Random numbers for sampling: one shared generator, or one stream per row of the batch.

A shared `torch.Generator` hands each decoding step's uniforms to the rows in batch order, so
what a row samples depends on which rows share its batch. RL rollouts are sampled in shares
across data-parallel ranks and must be the rollouts one process samples: there every row has
its own seeded stream (`RowStreams`), and its i-th draw is the same in any batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

SEED_LIMIT = 2**62  # row seeds are drawn below this: any torch generator takes them
CHUNK = 64  # uniforms drawn ahead per row at a time: one decoding step usually takes one


class RowStreams:
    """A seeded stream of uniforms for each row of a batch; each row's draws come in order
    from its own stream, whichever rows are drawn for together. The streams run on the CPU,
    so a seed samples the same tokens on any device."""

    def __init__(self, seeds: list[int]) -> None:
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.drawn = torch.empty(len(seeds), 0)  # [B, K] each row's uniforms drawn so far
        self.used = torch.zeros(len(seeds), dtype=torch.long)  # [B] uniforms taken per row

    def __call__(self, rows: Tensor | None, device: torch.device) -> Tensor:
        """The next uniform of each of `rows` (None: every row), as [R, 1] on `device`."""
        picked = torch.arange(len(self.used)) if rows is None else rows.cpu()
        needed = int(self.used[picked].max()) + 1 if len(picked) else 0
        if needed > self.drawn.shape[1]:
            more = torch.stack([torch.rand(CHUNK, generator=g) for g in self.generators])
            self.drawn = torch.cat([self.drawn, more], dim=1)
        uniforms = self.drawn[picked, self.used[picked]]
        self.used[picked] += 1
        return uniforms[:, None].to(device)


RandomSource = torch.Generator | RowStreams | None


def uniforms(source: RandomSource, count: int, rows: Tensor | None, device: torch.device) -> Tensor:
    """[count, 1] uniforms for `count` rows of a batch (`rows` their indices; None: all)."""
    if isinstance(source, RowStreams):
        return source(rows, device)
    return torch.rand(count, 1, generator=source, device=device)
