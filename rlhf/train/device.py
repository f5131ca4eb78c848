"""Device choice, mixed precision and random-number state: what makes a run repeatable."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from rlhf.errors import ResourceError


def resolve_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ResourceError(
            "params.yaml asks for device: cuda, but torch sees no CUDA device here; set "
            "device: auto or cpu, or run where a GPU is visible (docker run --gpus all)"
        )
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def pin_threads(count: int) -> None:
    """Fix torch's CPU intra-op thread count (0: leave torch's default, the cores, or
    OMP_NUM_THREADS where a launcher shares them out). How a reduction is split among threads
    decides the order its floats are summed in, so the same params give bit-identical CPU
    results only at the same count."""
    if count:
        torch.set_num_threads(count)


@contextlib.contextmanager
def autocast(device: torch.device, bf16: bool) -> Iterator[None]:
    """bf16 autocast on CUDA when asked; full precision elsewhere (CPU bf16 is slower here)."""
    if bf16 and device.type == "cuda":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            yield
    else:
        yield


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host batch on `device`. To a GPU through pinned memory without waiting: the host
    goes on (preparing the next batch) while the copy and the step run."""
    if device.type != "cuda":
        return batch.to(device)
    return batch.pin_memory().to(device, non_blocking=True)


def rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def compile_report() -> str | None:
    """How long `torch.compile` has worked in this process (tracing, code generation,
    backward graphs), for a stage's log; None where nothing was compiled."""
    from torch._dynamo.utils import calculate_time_spent

    seconds = calculate_time_spent().get("total_wall_time", 0.0)
    return f"compiling took {seconds:.1f} s" if seconds else None
