"""Checkpoints as plain tensors and primitives, loadable with `weights_only=True`.

Pickled objects in a checkpoint can run code on load, so nothing but state dicts, numbers,
strings and lists goes in, and everything comes out through `torch.load(weights_only=True)`.
A model checkpoint names its backbone and architecture, so it rebuilds without params.yaml.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from rlhf.atomic import atomic_path
from rlhf.data.tokenizer import Tokenizer
from rlhf.models.backbone import Backbone
from rlhf.models.registry import build


def save(path: str | Path, payload: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load(path: str | Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def model_payload(
    model: Backbone, tokenizer: Tokenizer, params_hash: str, kind: str, **extra: Any
) -> dict[str, Any]:
    """What a finished stage stores: weights, backbone and architecture, tokenizer identity,
    params hash."""
    return {
        "kind": kind,
        "backbone": model.name,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "model_config": dataclasses.asdict(model.config),
        "tokenizer": tokenizer.identity,
        "params_hash": params_hash,
        **extra,
    }


def load_model(
    path: str | Path, tokenizer: Tokenizer | None = None, device: str | torch.device = "cpu"
) -> tuple[Backbone, dict[str, Any]]:
    """Rebuild the model a checkpoint holds; refuse a tokenizer it was not trained with."""
    payload = load(path)
    if tokenizer is not None and payload["tokenizer"] != tokenizer.identity:
        raise ValueError(
            f"{path} was trained with tokenizer {payload['tokenizer']}, but the tokenizer given "
            f"is {tokenizer.identity}; rerun the stages after the tokenizer (dvc repro)"
        )
    model = build(payload["backbone"], payload["model_config"])
    model.load_state_dict(payload["model"])
    return model.to(device).eval(), payload


def load_resume(path: str | Path, fingerprint: str) -> dict[str, Any] | None:
    """Resume state saved for these exact inputs, code and params, or None.

    State from other inputs (a changed param, new data) is ignored rather than resumed: it
    would silently mix two runs.
    """
    path = Path(path)
    if not path.exists():
        return None
    state = load(path)
    return state if state.get("fingerprint") == fingerprint else None


def save_resume(path: str | Path, fingerprint: str, state: dict[str, Any]) -> None:
    save(path, {**state, "fingerprint": fingerprint})
