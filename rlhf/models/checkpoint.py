"""Checkpoints as plain tensors and primitives, loadable with `weights_only=True`.

Pickled objects in a checkpoint can run code on load, so nothing but state dicts, numbers,
strings and lists goes in, and everything comes out through `torch.load(weights_only=True)`.
A model checkpoint names its backbone and architecture, so it rebuilds without params.yaml.
Every way a checkpoint can be wrong (missing, truncated, not a checkpoint, holding objects
that would need unpickling, lacking keys) is a `CheckpointError` naming the file.
"""

from __future__ import annotations

import dataclasses
import errno
import pickle
import pickletools
import time
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from rlhf.atomic import atomic_path
from rlhf.errors import CheckpointError
from rlhf.models.backbone import Backbone
from rlhf.models.lora import merged_state_dict
from rlhf.models.registry import build
from rlhf.tokenizer.tokenizer import Tokenizer

MODEL_KEYS = ("kind", "backbone", "model", "model_config", "tokenizer")


def save(path: str | Path, payload: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        try:
            torch.save(payload, tmp)
        except RuntimeError as exc:  # how torch reports a full disk: "unexpected pos ..."
            raise OSError(errno.ENOSPC, f"{_first_line(exc)}: is the disk full?") from exc


def _first_line(exc: BaseException) -> str:
    """The first sentence of an exception's message: torch appends paragraphs of advice."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return line.split(". ")[0].rstrip(".")


# what torch's weights-only unpickler says when a file names a callable (a pickle that would
# run code); bytes it cannot parse at all are damage, not a threat
CALLING_WORDS = ("global", "reduce", "build", "persistent_load", "find_class")
# the pickle opcodes that import or call: in a plain pickle (not torch.save's zip), which
# torch's unpickler may reject for an earlier opcode (protocol 4's FRAME) before naming them
CALLING_OPCODES = {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ",
                   "NEWOBJ_EX"}  # fmt: skip
SCANNED_BYTES = 1 << 20  # a pickle's imports come before the data they build


def _names_callables(path: Path) -> bool:
    """Whether the start of `path`, read as a pickle, imports or calls anything."""
    with path.open("rb") as handle:
        start = handle.read(SCANNED_BYTES)
    try:
        for opcode, _, _ in pickletools.genops(start):
            if opcode.name in CALLING_OPCODES:
                return True
    except ValueError:  # damaged or truncated bytes end the scan, nothing more
        pass
    return False


def _unpickling_reason(exc: pickle.UnpicklingError) -> str:
    """What torch's weights-only unpickler refused, without its advice to load with
    weights_only=False (which would run the file's code) or its links."""
    lines = (
        line.split("WeightsUnpickler error:")[-1].strip() for line in str(exc).splitlines()[1:]
    )
    reasons = [line for line in lines if line and not line.startswith("Check the documentation")]
    return reasons[0] if reasons else "an object outside tensors and primitives"


def load(path: str | Path, *, mmap: bool = False) -> dict[str, Any]:
    """A checkpoint's payload; `mmap` maps tensors from the file instead of reading them."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint; `dvc repro` writes it")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: an empty file, not a checkpoint; `dvc repro` rewrites it")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        reason = _unpickling_reason(exc)
        calls = any(word in reason.lower() for word in CALLING_WORDS) or _names_callables(path)
        if not calls:
            raise CheckpointError(
                f"{path}: not a readable checkpoint, truncated or corrupt ({reason})"
            ) from None
        raise CheckpointError(
            f"{path}: refused: it does not load as weights only ({reason}), "
            "so loading it could run code it holds; load only checkpoints this project wrote"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
        raise CheckpointError(
            f"{path}: not a readable checkpoint, truncated or corrupt ({_first_line(exc)})"
        ) from None
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path}: not a checkpoint of this project (no mapping inside)")
    return payload


def require(path: str | Path, payload: dict[str, Any], keys: Iterable[str]) -> None:
    missing = [k for k in keys if k not in payload]
    if missing:
        raise CheckpointError(
            f"{path}: checkpoint lacks {', '.join(repr(k) for k in missing)}; "
            "rerun the stage that wrote it (dvc repro)"
        )


def model_payload(
    model: Backbone, tokenizer: Tokenizer, params_hash: str, kind: str, **extra: Any
) -> dict[str, Any]:
    """What a finished stage stores: weights (LoRA adapters merged in), backbone and
    architecture, tokenizer identity, params hash."""
    return {
        "kind": kind,
        "backbone": model.name,
        "model": {k: v.detach().cpu() for k, v in merged_state_dict(model).items()},
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
    require(path, payload, MODEL_KEYS)
    if tokenizer is not None and payload["tokenizer"] != tokenizer.identity:
        raise CheckpointError(
            f"{path} was trained with tokenizer {payload['tokenizer']}, but the tokenizer given "
            f"is {tokenizer.identity}; rerun the stages after the tokenizer (dvc repro)"
        )
    try:
        model = build(payload["backbone"], payload["model_config"])
        model.load_state_dict(payload["model"])
    except (ValueError, TypeError, RuntimeError) as exc:
        raise CheckpointError(
            f"{path}: its weights do not fit its {payload['backbone']!r} architecture "
            f"({_first_line(exc)})"
        ) from None
    return model.to(device).eval(), payload


def model_config(path: str | Path) -> tuple[str, dict[str, Any]]:
    """(backbone, architecture) of a model checkpoint, without reading its weights."""
    payload = load(path, mmap=True)
    require(path, payload, MODEL_KEYS)
    return payload["backbone"], payload["model_config"]


def load_resume(
    path: str | Path,
    fingerprint: str,
    keys: Iterable[str],
    log: Callable[[str], None] = print,
    *,
    mmap: bool = False,
) -> dict[str, Any] | None:
    """Resume state saved for these exact inputs, code and params, or None; `mmap` maps its
    tensors from the file (processes reading one file then share its pages).

    State from other inputs (a changed param, new data) is ignored rather than resumed: it
    would silently mix two runs. State that cannot be read, or lacks one of `keys`, is moved
    aside (kept for a post-mortem, never deleted) with one line in the log, and the run
    starts fresh rather than failing on every rerun.
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        state = load(path, mmap=mmap)
        require(path, state, keys)
    except CheckpointError as exc:
        aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}")
        path.replace(aside)
        log(f"resume state {exc}; moved to {aside}, starting fresh")
        return None
    return state if state.get("fingerprint") == fingerprint else None


def save_resume(path: str | Path, fingerprint: str, state: dict[str, Any]) -> None:
    save(path, {**state, "fingerprint": fingerprint})
