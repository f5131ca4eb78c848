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
