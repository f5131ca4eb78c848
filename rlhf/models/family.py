"""What a backbone family declares: its model, the Hugging Face `model_type`s it reads, and
its conversion to and from their folders (`registry.py` lists the families)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from rlhf.models.backbone import Backbone

State = dict[str, Tensor]


@dataclass(frozen=True)
class Family:
    model: type[Backbone]
    model_types: Mapping[str, Any]  # the Hugging Face `model_type`s it reads
    config_from_hf: Callable[[dict[str, Any]], dict[str, Any]]  # config.json -> our config
    weights_from_hf: Callable[[State], State]  # their parameter names -> ours
    to_hf: Callable[[dict[str, Any], State], tuple[dict[str, Any], State]]  # ours -> theirs
