"""Backbones by name: the name a checkpoint records rebuilds its model.

Adding an architecture is a module implementing `Backbone` and one entry here.
"""

from __future__ import annotations

from typing import Any

from rlhf.models.backbone import Backbone
from rlhf.models.gpt import GPT
from rlhf.models.llama import Llama

BACKBONES: dict[str, type[Backbone]] = {GPT.name: GPT, Llama.name: Llama}


def build(name: str, config: dict[str, Any]) -> Backbone:
    """A freshly initialized backbone `name` with architecture `config`."""
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; known: {', '.join(BACKBONES)}")
    cls = BACKBONES[name]
    return cls(cls.config_class(**config))
