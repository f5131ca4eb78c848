"""Data parallelism under torchrun: which process this is, its share of each global batch, and
the reductions that make N processes compute what one does.

A training stage runs as `torchrun --nproc_per_node N` workers (`rlhf.stages.support.launch`); each
reads RANK, WORLD_SIZE and LOCAL_RANK from the environment torchrun sets. The batch size in
params.yaml is the global batch: every rank takes a share of the same seeded batch order,
and losses are normalized by the units (tokens, prompts) of the whole global batch, so
the gradient N processes apply equals the one process's, up to floating-point summation order.
Shares are strided (rank r takes rows r, r + N, ...): batches are cut from rows sorted by
length, and strides give every rank rows of every length.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlhf.errors import ResourceError

# a rank waiting this long in a collective for a peer gives up (the launcher stops the rest
# at once when one dies; this bounds a hang it cannot see, and covers rank 0 writing the
# resume state of a large model while the others wait at the next step)
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that logs and writes outputs."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def shares(self, rows: list[int]) -> list[list[int]]:
        """Every rank's strided share of a global batch, by rank."""
        return [rows[rank :: self.size] for rank in range(self.size)]

    def shard(self, rows: list[int]) -> tuple[list[int], bool]:
        """This rank's strided share of a global batch, and whether it holds any row.

        A rank left without rows (a last batch smaller than the world) forwards the batch's
        first row with weight 0: every rank must run the same forwards and backwards for the
        gradients to be reduced."""
        mine = self.shares(rows)[self.rank]
        return (mine, True) if mine else (rows[:1], False)

    def weighed_shard(
        self, rows: list[int], units: Callable[[list[int]], int]
    ) -> tuple[list[int], float]:
        """This rank's share of `rows` (`shard`) and the fraction of their `units` (tokens,
        say) it holds: 0 for a stand-in row, exactly 1 in one process."""
        mine, holds_rows = self.shard(rows)
        return mine, (units(mine) / units(rows) if holds_rows else 0.0)


def current_world() -> World:
    """The world torchrun describes in the environment; one process without it."""
    if "WORLD_SIZE" not in os.environ:
        return World()
    return World(
        rank=int(os.environ["RANK"]),
        size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ["LOCAL_RANK"]),
    )


def join(world: World, device: torch.device) -> torch.device:
    """Join the process group (NCCL on CUDA, gloo on CPU) and return this rank's device."""
    if not world.distributed:
        return device
    if device.type == "cuda":
        if world.local_rank >= torch.cuda.device_count():
            raise ResourceError(
                f"{world.size} processes on this host but {torch.cuda.device_count()} GPUs "
                "visible: set RLHF_NPROC to at most that (or auto)"
            )
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT, device_id=_device_id(device))
    return device


def _device_id(device: torch.device) -> torch.device | None:
    """NCCL binds the group to this rank's GPU up front; gloo takes none."""
    return device if device.type == "cuda" else None


def leave() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def sum_across(world: World, values: list[float], device: torch.device) -> list[float]:
    """Each value summed over the ranks (in float64, so the sum of a few ranks' partial sums
    adds no rounding of its own)."""
    if not world.distributed:
        return values
    totals = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    return totals.tolist()


def max_across(world: World, value: int, device: torch.device) -> int:
    """The largest of the ranks' values."""
    if not world.distributed:
        return value
    largest = torch.tensor([value], device=device)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    return int(largest)


def gather_rows(world: World, tensors: list[Tensor], count: int) -> list[Tensor]:
    """A global batch shared out by `World.shard`, whole again on every rank: each of
    `tensors` holds this rank's rows (its first `count`; 0 for a rank that held none), each
    result every rank's rows in global order. Shapes past the first agree across ranks."""
    if not world.distributed:
        return tensors
    device = tensors[0].device
    counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world.size)]
    dist.all_gather(counts, torch.tensor([count], device=device))
    sizes = [int(c) for c in counts]
    gathered = []
    for tensor in tensors:
        sent = tensor.to(torch.uint8) if tensor.dtype == torch.bool else tensor  # gloo: no bool
        padded = sent.new_zeros((max(sizes), *sent.shape[1:]))
        padded[:count] = sent[:count]
        parts = [torch.empty_like(padded) for _ in range(world.size)]
        dist.all_gather(parts, padded)
        whole = sent.new_empty((sum(sizes), *sent.shape[1:]))
        for rank, (part, size) in enumerate(zip(parts, sizes, strict=True)):
            whole[rank :: world.size] = part[:size]  # rank r held rows r, r + N, ...
        gathered.append(whole.to(tensor.dtype))
    return gathered


def data_parallel(model: nn.Module) -> nn.Module:
    """A DistributedDataParallel wrapper of `model`, averaging gradients across the ranks in
    backward."""
    # a stage trains some of the backbone's heads and not others (SFT no reward head): DDP
    # must find the unused ones each step, or their bucket never reduces anything. No
    # device_ids: the inputs are already on the device, and DDP would copy (and rebuild) any
    # dataclass it was passed
    return nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)


def globally_normalized(loss: Tensor, share: float, world: World) -> Tensor:
    """The loss to backpropagate so that the average over ranks (DDP's, FSDP2's) is the mean
    over all units of the global batch: a rank's mean over its units weighted by `share`, its
    fraction of the batch's units (the whole batch in one pass of one process: exactly 1)."""
    return loss * (share * world.size)
