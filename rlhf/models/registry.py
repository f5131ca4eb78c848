"""Backbone families by name: the name a checkpoint records rebuilds its model, and a Hugging
Face folder's `model_type` picks the family that reads it.

A family is a folder, `rlhf/models/<family>/`: its module (a `Backbone`), its conversion to
and from Hugging Face folders (`convert.py`), and its `FAMILY` entry (`__init__.py`, a
`family.Family`), which this registry lists. A new architecture is a new folder and one line
here (and, if it reads Hugging Face folders whose config.json sizes the model under keys of
its own, those keys' bounds in `hf.SIZE_LIMITS`); another Hugging Face family an existing
backbone covers is one entry in that backbone's `convert.py`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from rlhf.models import gpt, llama
from rlhf.models.backbone import Backbone
from rlhf.models.family import Family

FAMILIES: tuple[Family, ...] = (gpt.FAMILY, llama.FAMILY)
SCRATCH = gpt.FAMILY.model.name  # the backbone `model.init: scratch` builds from `model`'s shape


def family(name: str) -> Family:
    """The family of backbone `name` (as a checkpoint records it)."""
    for candidate in FAMILIES:
        if candidate.model.name == name:
            return candidate
    known = ", ".join(f.model.name for f in FAMILIES)
    raise ValueError(f"unknown backbone {name!r}; known: {known}")


def reading(model_type: object) -> Family | None:
    """The family that reads Hugging Face folders of `model_type` (config.json's value,
    whatever its type), if any."""
    if not isinstance(model_type, str):
        return None
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def model_types() -> list[str]:
    return [t for f in FAMILIES for t in f.model_types]


def build(name: str, config: dict[str, Any]) -> Backbone:
    """A freshly initialized backbone `name` with architecture `config`."""
    cls = family(name).model
    return cls(cls.config_class(**config))


class _NoRandomFill(TorchFunctionMode):
    """`normal_` left out on `meta`, which holds no values to fill: its meta implementation
    imports torch._dynamo on first use, 2 s of CPU that every stage paid for its memory
    estimate (and a refused one before its one-line error)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.normal_, torch.nn.init.normal_):  # (tensor, ...) either way
            tensor = args[0] if args else kwargs["tensor"]
            if tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def build_on_meta(name: str, config: dict[str, Any]) -> Backbone:
    """Backbone `name` with architecture `config` on the `meta` device: its shapes, nothing
    allocated, no values (what the memory estimate and the weights check read)."""
    with torch.device("meta"), _NoRandomFill():
        return build(name, config)
