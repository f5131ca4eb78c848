"""A running sum that compiled code leaves to ATen's kernel.

Inductor generates its own kernel for `cumsum`, and on CUDA it splits a long scan over few rows
(a sampling step's [B, V] probabilities) into a split-scan kernel; torch 2.11's code generation
fails on it at GPT-2's vocabulary (an `InductorError` in `get_block_shape`, seen on an H100).
As an opaque custom op the scan compiles into a call of the eager kernel instead: it still
captures into a CUDA graph and adds no graph break, and the compiled sums are the eager ones
bit for bit (same kernel, same order).
"""

from __future__ import annotations

import torch
from torch import Tensor


@torch.library.custom_op("rlhf::cumsum_last", mutates_args=())
def _cumsum_last(values: Tensor) -> Tensor:
    return values.cumsum(-1)


@_cumsum_last.register_fake
def _(values: Tensor) -> Tensor:
    return values.cumsum(-1)  # on fake tensors: the shape and dtype (int64 for bool) it gives


def running_sum(values: Tensor) -> Tensor:
    """`values.cumsum(-1)`; under torch.compile an opaque call of the eager kernel, eagerly
    the plain op (no custom-op dispatch per step). Not differentiable when compiled: for
    sampling probabilities."""
    if torch.compiler.is_compiling():
        return _cumsum_last(values)
    return values.cumsum(-1)
