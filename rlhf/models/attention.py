"""Attention over a mask, plain causal, or a packed stream's segments (varlen).

A packed forward (`rlhf.models.packing`) lays many rows back to back. Under a block-diagonal
mask, SDPA computes every bin's full L x L scores and masks most of them away, on the
memory-efficient kernel (a mask rules flash out). On CUDA in half precision the stream goes
instead to `torch.nn.attention.varlen` (flash attention over variable-length segments, in
torch since 2.9): exactly each row's causal attention, no L^2 mask, no masked-out work. The
masked SDPA path stays the reference (the CPU's, float32's, dropout's).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

HALF = (torch.bfloat16, torch.float16)  # the dtypes flash attention takes
# what flash attention runs on: Ampere or newer, heads of at most 256 dimensions; unlike SDPA
# the varlen op has no other kernel to fall back to
FLASH_CAPABILITY, FLASH_HEAD_DIM = (8, 0), 256


@dataclass(frozen=True)
class Segments:
    """A flat token stream [1, N] cut into runs that attend causally within themselves."""

    starts: Tensor  # [K + 1] int32 on the stream's device: where each run starts, then N
    longest: int  # at least the longest run (fixed per model, so compiles do not vary)


Mask = Tensor | Segments | None  # [B, 1, T, L] (True = attend), segments, or plain causal


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Mask, dropout: float = 0.0) -> Tensor:
    """Attention [B, H, T, D] of q [B, H, T, D] over k, v [B, H, L, D] (as many heads as q)."""
    if isinstance(mask, Segments):
        return segment_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None
    )


def segment_attention(q: Tensor, k: Tensor, v: Tensor, segments: Segments) -> Tensor:
    """Causal attention within each segment of the stream q, k, v [1, H, N, D], in v's half
    precision: under autocast a rotary embedding leaves q and k in float32, and autocast,
    which casts SDPA's inputs, knows nothing of the varlen op."""
    varlen = VARLEN[0]
    # [1, H, N, D] -> [N, H, D]: the layout the varlen kernel reads
    q, k, v = (t[0].transpose(0, 1).to(v.dtype).contiguous() for t in (q, k, v))
    starts, longest = segments.starts, segments.longest
    out = varlen.kernel(q, k, v, starts, starts, longest, longest, **varlen.causal)
    return out.transpose(0, 1)[None]  # [1, H, N, D]


@dataclass(frozen=True)
class Varlen:
    """This torch's varlen attention, and how it is asked for causal masking (resolved once,
    outside any compiled graph, which then reads it as a plain global)."""

    kernel: Callable[..., Tensor]  # torch.nn.attention.varlen.varlen_attn
    causal: dict[str, Any]  # how it is asked for causal masking


VARLEN: list[Varlen] = []  # this torch's, once `varlen_available` has resolved it


def varlen_available() -> bool:
    """Whether this torch has varlen attention, resolved into VARLEN on the first call: an
    import of 2 s (tabulate among others) kept off every stage's start, made by the first
    packed forward before any compiled block reads VARLEN. Torch 2.9-2.11 ask for causal
    masking with `is_causal`, later ones with a window of (-1, 0)."""
    if not VARLEN:
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:
            return False
        is_causal = "is_causal" in inspect.signature(varlen_attn).parameters
        causal = {"is_causal": True} if is_causal else {"window_size": (-1, 0)}
        VARLEN.append(Varlen(varlen_attn, causal))
    return True


def runs_varlen(device: torch.device, dtype: torch.dtype, dropout: float, head_dim: int) -> bool:
    """Whether a packed forward on `device` whose weights are `dtype` (autocast's dtype
    instead where autocast is on) and whose heads have `head_dim` dimensions attends through
    the varlen kernel: CUDA on a GPU flash attention runs on, half precision, no attention
    dropout (the kernel has none), and a torch that has it."""
    if device.type != "cuda" or dropout > 0 or head_dim > FLASH_HEAD_DIM:
        return False
    if torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
    return dtype in HALF and runs_flash(device.index) and varlen_available()


@functools.cache
def runs_flash(index: int | None) -> bool:
    """Whether the CUDA device `index` (None: the current one) is one flash attention runs
    on."""
    return torch.cuda.get_device_capability(index) >= FLASH_CAPABILITY
