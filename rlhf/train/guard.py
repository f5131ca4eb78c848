"""Stop training at the first non-finite loss or gradient norm.

One NaN in a loss spreads through the update into every weight, and a run that trains on
ends "successfully" with a model of NaNs and NaN metrics. The guard runs before each update,
so the weights, the resume state and the stage's outputs all stay as they were before it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor, nn

from rlhf.errors import PipelineError

Terms = Mapping[str, float | Tensor]


class NonFiniteError(PipelineError):
    """A loss or gradient norm that is NaN or infinite, with the terms that were."""

    def __init__(self, step: int, terms: dict[str, float]):
        super().__init__(step, terms)
        self.step, self.terms = step, terms
        self.last_good = "none saved yet"  # the stage fills in its resume file

    def __str__(self) -> str:
        named = ", ".join(f"{k} {v}" for k, v in self.terms.items())
        return (
            f"training step {self.step}: non-finite {named}; stopped before the update, no "
            f"output written; last good resume state: {self.last_good}. Lower the learning "
            "rate or the params that scale the loss (beta, kl_coef, reward_clip)"
        )


def non_finite(terms: Terms) -> dict[str, float]:
    values = {k: float(v.detach()) if isinstance(v, Tensor) else float(v) for k, v in terms.items()}
    return {k: v for k, v in values.items() if not math.isfinite(v)}


def require_finite(
    step: int, checked: Terms, context: Terms | Callable[[], Terms] | None = None
) -> None:
    """Raise NonFiniteError if a value in `checked` is not finite, naming it and whichever
    of `context` (the loss's parts, its inputs; a function giving them, read only then)
    were not finite either."""
    bad = non_finite(checked)
    if bad:
        context = context() if callable(context) else context
        raise NonFiniteError(step, bad | non_finite(context or {}))


def grad_norm(parameters: Iterable[nn.Parameter], clip: float) -> Tensor:
    """The global gradient norm, clipped to `clip` when it is positive."""
    parameters = [p for p in parameters if p.grad is not None]
    if clip > 0:
        norm = nn.utils.clip_grad_norm_(parameters, clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
    # sharded (FSDP2) gradients give a DTensor, possible only once its module is imported:
    # a process that never shards skips that import (over a second at every stage's start)
    dtensor = sys.modules.get("torch.distributed.tensor")
    sharded = dtensor is not None and isinstance(norm, dtensor.DTensor)
    return norm.full_tensor() if sharded else norm
