"""The optimizer and learning-rate schedule every trained model uses."""

from __future__ import annotations

import math

import torch

from rlhf.models.backbone import Backbone


def adamw(
    model: Backbone, lr: float, weight_decay: float, betas: tuple[float, float]
) -> torch.optim.AdamW:
    """AdamW over the backbone's own parameter groups (decay on matrices and embeddings),
    fused: one kernel over all parameters, where the per-tensor loop took a tenth of a PPO
    update on a CPU."""
    return torch.optim.AdamW(model.optimizer_groups(weight_decay), lr=lr, betas=betas, fused=True)


def lr_at(step: int, peak: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to `peak`, then cosine decay to `peak * min_ratio` at `total` steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
