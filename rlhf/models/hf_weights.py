"""A Hugging Face folder's weights: every safetensors file (one, or the shards its index
names) checked against its own bytes and against config.json before any model is built, then
read.

Weights come from anywhere, so each failure a damaged or hostile folder can cause is one
`CheckpointError` naming the file, the tensor and what was expected, in time and memory
bounded by the headers, not by what they claim: an index naming a file outside the folder, a
shard missing, a tensor in two shards; a header that is not well-formed or disagrees with its
bytes (`safetensors_header.py`); a tensor of a dtype weights cannot have, of a shape other
than config.json implies, missing, or one the model has no place for, which loading would
silently drop (only the buffers of `IGNORED_SUFFIXES` are ignored, on purpose); a weight
holding NaN or infinity, which would stop training at its first step. The shapes expected
come from the model itself, built on the `meta` device (no memory) from the config, through
the family's own name map (`convert.py`), so the check cannot drift from what loads.

A symlinked file is read where it points: the Hugging Face cache's folders are links into
its blob store. A link to something that is not a regular file (a device, a pipe) is refused.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor, nn

from rlhf.errors import CheckpointError
from rlhf.models import registry
from rlhf.models.family import Family, State
from rlhf.models.safetensors_header import TensorEntry, read_header, shown, strict_json

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
MAX_INDEX_BYTES = 100_000_000  # a 1T mixture of experts' index is about 10 MB; 58 MB parse in 1 s
OWN_HEADS = ("value_head.", "reward_head.")  # ours, absent from a language model's folder
SCORE_WEIGHT = "score.weight"  # a sequence classifier's head: our reward head, without bias
LM_HEAD = "lm_head.weight"
# buffers old checkpoints saved that are recomputed here
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # what a weight is stored as; ints are not weights
FINITE_CHUNK = 1 << 24  # elements checked for NaN at a time: a bounded temporary


@dataclass(frozen=True)
class Stored:
    """A tensor in a weights file, under the name the file gives it."""

    file: Path
    name: str
    entry: TensorEntry


def _regular_file(path: Path) -> bool:
    """Whether `path` (a link followed) is a regular file; refused when it is something else."""
    if not os.path.lexists(path):
        return False
    if not path.is_file():
        raise CheckpointError(
            f"{path}: not a regular file (a folder, a device, a pipe or a link to nothing)"
        )
    return True


def _weight_map(folder: Path) -> dict[str, str]:
    """The index's tensor -> shard map, each shard a file directly inside the folder."""
    index = folder / WEIGHTS_INDEX
    if not _regular_file(index):
        raise CheckpointError(
            f"{folder}: no {WEIGHTS_FILE} or {WEIGHTS_INDEX} (weights load from safetensors "
            "only; convert a pytorch_model.bin folder with save_pretrained first)"
        )
    if index.stat().st_size > MAX_INDEX_BYTES:
        raise CheckpointError(f"{index}: over {MAX_INDEX_BYTES:,} bytes; not a shard index")
    try:
        content = strict_json(index.read_bytes())
    except ValueError as exc:
        raise CheckpointError(f"{index}: not valid JSON ({exc})") from None
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: its weight_map is not a map of tensor names to files")
    for shard in sorted(set(weight_map.values())):
        if shard in ("", ".", "..") or Path(shard).name != shard:
            raise CheckpointError(
                f"{index}: names shard {shown(shard)}, which is not a file inside {folder}"
            )
    missing = [s for s in sorted(set(weight_map.values())) if not _regular_file(folder / s)]
    if missing:
        raise CheckpointError(
            f"{folder}: shard {shown(missing[0])} named in {WEIGHTS_INDEX} is missing "
            f"({len(missing)} of {len(set(weight_map.values()))} shards missing)"
        )
    return weight_map


def _stored_tensors(folder: Path) -> dict[str, Stored]:
    """Every tensor of the folder's weights files, by the name the files give it: the one
    file, or the shards the index names, which must hold exactly what it lists."""
    if _regular_file(folder / WEIGHTS_FILE):
        file = folder / WEIGHTS_FILE
        return {name: Stored(file, name, e) for name, e in read_header(file).items()}
    weight_map = _weight_map(folder)
    stored: dict[str, Stored] = {}
    for shard in sorted(set(weight_map.values())):
        file = folder / shard
        for name, entry in read_header(file).items():
            if name in stored:
                raise CheckpointError(
                    f"{file}: tensor {shown(name)} is also in {stored[name].file.name}; which "
                    "one is the weight?"
                )
            listed = weight_map.get(name)
            if listed != shard:
                where = f"lists it in {shown(listed)}" if listed else "does not list it"
                raise CheckpointError(
                    f"{file}: holds tensor {shown(name)}; {WEIGHTS_INDEX} {where}"
                )
            stored[name] = Stored(file, name, entry)
    unstored = sorted(set(weight_map) - set(stored))
    if unstored:
        name = unstored[0]
        raise CheckpointError(
            f"{folder / weight_map[name]}: lacks tensor {shown(name)}, which {WEIGHTS_INDEX} "
            f"lists in it ({len(unstored)} such)"
        )
    return stored


def check_files(folder: Path) -> None:
    """The folder's safetensors files, if it has any, checked against their own bytes and
    its index: for a loader that reads them unchecked (transformers, for reward models of
    families we have no backbone for), which cannot say what a tensor should be."""
    if os.path.lexists(folder / WEIGHTS_FILE) or os.path.lexists(folder / WEIGHTS_INDEX):
        _stored_tensors(folder)


def _ours(family: Family, name: str, shape: tuple[int, ...] = (0, 0)) -> tuple[str, list[int]]:
    """(our name, the shape a tensor of `shape` takes) for the file's tensor `name`, through
    the family's own map, on a `meta` tensor (GPT-2's Conv1D weights are transposed)."""
    [(ours, tensor)] = family.weights_from_hf({name: torch.empty(shape, device="meta")}).items()
    return ours, list(tensor.shape)


@dataclass(frozen=True)
class Expected:
    """What a model of the config holds, by our names: each tensor's shape, and those a
    folder may lack (the LM head where it is the embedding, or in a reward model; the score
    head, which only a sequence classifier has)."""

    shapes: dict[str, list[int]]
    optional: frozenset[str]
    config: dict[str, Any]  # the model's, every field stated: what `to_hf` reads


def _expected(backbone: str, config: dict[str, Any]) -> Expected:
    """The tensors a folder must hold for the backbone `config` describes (the context
    uncut: GPT-2 keeps n_positions position embeddings), read off the model built on the
    `meta` device, which allocates nothing."""
    model = registry.build_on_meta(backbone, config)
    state = model.state_dict()
    shapes = {k: list(v.shape) for k, v in state.items() if not k.startswith(OWN_HEADS)}
    shapes[SCORE_WEIGHT] = list(state["reward_head.weight"].shape)
    tied = any(
        model.lm_head.weight is m.weight for m in model.modules() if isinstance(m, nn.Embedding)
    )  # the LM head is the embedding, which the folder holds once
    optional = frozenset({SCORE_WEIGHT, *([LM_HEAD] if tied else [])})
    return Expected(shapes, optional, dataclasses.asdict(model.config))


def _check(family: Family, want: Expected, stored: Stored) -> str | None:
    """Our name for a stored tensor that fits the model, or None for an ignored buffer."""
    where = f"{stored.file}: tensor {shown(stored.name)}"
    ours, _ = _ours(family, stored.name)
    if ours.endswith(IGNORED_SUFFIXES):
        return None
    if ours not in want.shapes:
        raise CheckpointError(
            f"{where} has no place in the model config.json describes (loading would drop "
            f"it; only buffers ending in {', '.join(IGNORED_SUFFIXES)} are ignored)"
        )
    found = list(stored.entry.shape)
    if ours == SCORE_WEIGHT and len(found) == 2 and found[0] != 1:
        raise CheckpointError(
            f"{where}: a sequence classifier with {found[0]} labels; a reward model has one score"
        )
    _, shape = _ours(family, stored.name, tuple(want.shapes[ours]))  # in the file's layout
    if found != shape:
        raise CheckpointError(f"{where} has shape {found}; config.json implies {shape}")
    if stored.entry.dtype not in FLOAT_DTYPES:
        raise CheckpointError(
            f"{where} is stored as {stored.entry.dtype}; weights are {', '.join(FLOAT_DTYPES)}"
        )
    return ours


def _checked(folder: Path, backbone: str, config: dict[str, Any]) -> dict[str, Stored]:
    """The folder's tensors that load into the backbone `config` describes, by our names,
    once every file and tensor is checked; nothing is read beyond the headers."""
    family, want = registry.family(backbone), _expected(backbone, config)
    found: dict[str, Stored] = {}
    for stored in _stored_tensors(folder).values():
        ours = _check(family, want, stored)
        if ours is None:
            continue
        if ours in found:
            raise CheckpointError(
                f"{stored.file}: tensors {shown(found[ours].name)} and {shown(stored.name)} "
                "are one weight under two names"
            )
        found[ours] = stored
    optional = want.optional | ({LM_HEAD} if SCORE_WEIGHT in found else set())
    missing = [k for k in want.shapes if k not in found and k not in optional]
    if missing:
        shape = want.shapes[missing[0]]
        _, named = family.to_hf(want.config, {missing[0]: torch.empty(shape, device="meta")})
        name = next(iter(named), missing[0])
        raise CheckpointError(
            f"{folder}: no weights file holds {name} (shape {shape}), which config.json's "
            f"model needs ({len(missing)} such missing)"
        )
    return found


def _finite(file: Path, name: str, tensor: Tensor) -> Tensor:
    """`tensor`, refused if a value is NaN or infinite (counted a chunk at a time)."""
    bad = sum(int((~chunk.isfinite()).sum()) for chunk in tensor.reshape(-1).split(FINITE_CHUNK))
    if bad:
        raise CheckpointError(
            f"{file}: tensor {shown(name)} holds {bad:,} NaN or infinite values (in float32) "
            f"of {tensor.numel():,}; a trained model's weights are finite"
        )
    return tensor


def load_weights(folder: Path, backbone: str, config: dict[str, Any]) -> State:
    """The folder's weights for the backbone `config` describes, by our names, in float32,
    every value finite; a sequence classifier's score head as our reward head (bias 0)."""
    family = registry.family(backbone)
    by_file: dict[Path, dict[str, str]] = {}  # file -> its names -> ours
    for ours, stored in _checked(folder, backbone, config).items():
        by_file.setdefault(stored.file, {})[stored.name] = ours
    state: State = {}
    for file, names in by_file.items():
        with safe_open(file, framework="pt") as handle:
            for name, ours in names.items():
                [tensor] = family.weights_from_hf({name: handle.get_tensor(name)}).values()
                state[ours] = _finite(file, name, tensor.float())
    classifier = state.pop(SCORE_WEIGHT, None)  # a *ForSequenceClassification reward model
    if classifier is not None:
        state["reward_head.weight"] = classifier
        state["reward_head.bias"] = torch.zeros(1)
    return state
