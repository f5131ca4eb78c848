"""Low-rank adapters (LoRA, Hu et al. 2021) on the linear layers of a backbone's blocks.

With adapters the RL stages train a few million parameters instead of every weight, and
the frozen reference is the very same model with its adapters switched off: PPO on a model
that fills a GPU keeps one copy of the base weights, not two. A layer's update is
`scale * B @ A` with B starting at zero, so the adapted model starts as the base model, and
the weights a stage writes are merged (`W + scale * B @ A`): an ordinary checkpoint that every
other stage, `rlhf export` and transformers load as they load any.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from rlhf.models.backbone import Backbone


class LoRALinear(nn.Module):
    """A frozen `nn.Linear` plus a trainable rank-`rank` update scaled by alpha / rank."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        weight = base.weight
        self.lora_a = nn.Parameter(torch.empty(rank, weight.shape[1], device=weight.device))
        self.lora_b = nn.Parameter(torch.zeros(weight.shape[0], rank, device=weight.device))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # as nn.Linear and PEFT do
        self.alpha, self.scale = alpha, alpha / rank
        self.enabled = True

    def forward(self, x: Tensor) -> Tensor:
        out = self.base(x)
        if not self.enabled:
            return out
        if not torch.is_autocast_enabled(x.device.type):  # autocast casts for the matmuls
            x = x.to(self.lora_a.dtype)
        update = (x @ self.lora_a.T) @ self.lora_b.T  # [..., out]
        return out + (self.scale * update).to(out.dtype)

    @torch.no_grad()
    def merged_weight(self) -> Tensor:
        """The base weight with the update added in: [out, in]."""
        update = self.scale * (self.lora_b @ self.lora_a)
        return (self.base.weight.float() + update.float()).to(self.base.weight.dtype)


def add_adapters(model: Backbone, rank: int, alpha: float) -> Backbone:
    """Freeze `model` and put an adapter on every linear layer of its transformer blocks
    (attention and MLP); the value head, which a critic trains from scratch, stays trainable.
    Returns `model`, adapted in place."""
    if adapters(model):
        raise ValueError("the model has adapters already")
    model.requires_grad_(False)
    for block in model.transformer_blocks():
        for parent in list(block.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, LoRALinear(child, rank, alpha))
    model.value_head.requires_grad_(True)
    return model


def adapters(model: nn.Module) -> list[LoRALinear]:
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def plain_like(model: Backbone, device: torch.device) -> Backbone:
    """A freshly initialized model of `model`'s architecture and dtype on `device`, no
    adapters."""
    with torch.device(device):
        fresh = type(model)(model.config).to(next(model.parameters()).dtype)
    fresh.activation_checkpointing = model.activation_checkpointing
    return fresh


def same_layout(model: Backbone, device: torch.device) -> Backbone:
    """A freshly initialized model of `model`'s architecture on `device`, with adapters of
    the same rank where `model` has them: a plain module to copy `model`'s state into."""
    fresh = plain_like(model, device)
    if layers := adapters(model):
        add_adapters(fresh, layers[0].lora_a.shape[0], layers[0].alpha)
    return fresh


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """`model` computes as its base model inside: the RL reference of an adapted policy."""
    layers = adapters(model)
    were = [layer.enabled for layer in layers]
    for layer in layers:
        layer.enabled = False
    try:
        yield
    finally:
        for layer, enabled in zip(layers, were, strict=True):
            layer.enabled = enabled


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, Any]:
    """`model`'s state with every adapter merged into its base weight, under the names the
    unadapted model has: what checkpoints store. The model's own state when it has none."""
    state = model.state_dict()
    for path, layer in model.named_modules():
        if isinstance(layer, LoRALinear):
            for name in ("lora_a", "lora_b"):
                del state[f"{path}.{name}"]
            state[f"{path}.weight"] = layer.merged_weight()
            del state[f"{path}.base.weight"]
            if layer.base.bias is not None:
                state[f"{path}.bias"] = state.pop(f"{path}.base.bias")
    return state


def merged_model(model: Backbone) -> Backbone:
    """A plain copy of `model` with its adapters merged in, in eval mode."""
    plain = plain_like(model, next(model.parameters()).device)
    plain.load_state_dict(merged_state_dict(model))
    return plain.eval()
