"""A safetensors file's header, read and checked against the file's own bytes before
safetensors (or torch) touches it.

Weights are untrusted input, as chat templates are: a model folder comes from anywhere. The
safetensors library refuses a malformed file with a traceback, and its checks stop at the
format: a float weight stored as integers loads. So the header is parsed here, within bounds
set before anything is read (its 8-byte length field is checked against the file's size and
a limit, so a field of 2^63 allocates nothing), and checked at least as strictly as the
library checks it, so that what passes here loads there: a JSON object of tensors, each a
dtype of known width, a shape and the offsets of its bytes, which its dtype and shape fill
exactly; the tensors tile the data that follows the header, without gap or overlap. Stricter
than the library on one point: a key twice in the JSON, of which it silently keeps one. Any
failure is one `CheckpointError` naming the file and the tensor. What a tensor must be to fit
a model is `hf_weights.py`'s job.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf.errors import CheckpointError

LENGTH_BYTES = 8  # the header's length, a little-endian u64, opens the file
# Real headers are KBs (a 1B model's 20 KB, a shard of a 671B mixture of experts' about
# 100 KB). Parsed in Python, a header costs about 13 times its size in memory and 0.3 s a MB
# on a busy CPU (measured at 95 MB: 1.2 GB, 32 s), so the bound is well under the library's
# own 100 MB, meant for its Rust parser: at most about 200 MB and 5 s.
MAX_HEADER_BYTES = 16_000_000
MAX_RANK = 64  # dimensions a tensor may have; weights have 1 or 2
MAX_INTEGER = 2**64 - 1  # sizes and offsets are u64 to the library
METADATA = "__metadata__"  # the header's one entry that is not a tensor: strings to strings
ENTRY_KEYS = ("dtype", "shape", "data_offsets")  # what each tensor states (others are ignored)
# bytes per element of the dtypes a file may hold (sub-byte formats are refused as unknown)
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}  # fmt: skip
LFS_POINTER = b"version https://git-lfs"  # what a clone without git-lfs leaves in its place
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # how JSON writes half a UTF-16 pair
SHOWN_CHARS = 120  # of a value from the file quoted in an error: a name can be megabytes


def shown(value: object) -> str:
    """`value`'s repr for an error line, cut to `SHOWN_CHARS`."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header describes it: `begin` and `end` are byte offsets into the
    data that follows the header."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors of the safetensors file `path`, by name, once its header is well-formed
    and agrees with the bytes after it; a `CheckpointError` naming the file otherwise."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            start = handle.read(len(LFS_POINTER))
            if start == LFS_POINTER:
                raise CheckpointError(
                    f"{path}: a Git LFS pointer, not the weights; fetch them with `git lfs pull`"
                )
            length = _header_length(path, start[:LENGTH_BYTES], size)
            handle.seek(LENGTH_BYTES)
            raw = handle.read(length)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    header = _parse(path, raw)
    metadata = header.pop(METADATA, None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise CheckpointError(f"{path}: header's {METADATA} is not a map of strings to strings")
    tensors = {name: _entry(path, name, value) for name, value in header.items()}
    _check_tiling(path, tensors, size - LENGTH_BYTES - length)
    return tensors


def _header_length(path: Path, start: bytes, size: int) -> int:
    """The header's length from the file's first 8 bytes, refused unless it fits the file and
    `MAX_HEADER_BYTES` (checked before reading it)."""
    if len(start) < LENGTH_BYTES:
        raise CheckpointError(
            f"{path}: not a safetensors file: {size} bytes, fewer than the {LENGTH_BYTES} of "
            "its header's length"
        )
    length = int.from_bytes(start, "little")
    if length > size - LENGTH_BYTES:
        raise CheckpointError(
            f"{path}: not a safetensors file (or a truncated one): its first {LENGTH_BYTES} "
            f"bytes give a header of {length:,} bytes, and only {size - LENGTH_BYTES:,} follow"
        )
    if length > MAX_HEADER_BYTES:
        raise CheckpointError(
            f"{path}: its header claims {length:,} bytes, more than the {MAX_HEADER_BYTES:,} "
            "a safetensors header may have"
        )
    return length


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, refused where a key comes twice."""
    unique = dict(pairs)
    if len(unique) < len(pairs):  # the rare case, searched only then
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"key {shown(key)} appears twice")
            seen.add(key)
    return unique


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def strict_json(raw: bytes) -> Any:
    """`raw` parsed as JSON at least as strictly as the safetensors library parses it: UTF-8,
    no NaN or Infinity, no lone surrogates, and no duplicate keys (which one is meant?); a
    ValueError saying what is wrong otherwise, nesting too deep included."""
    try:
        parsed = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant
        )
        if SURROGATE_ESCAPE.search(raw):  # rare: only then can a string hold a lone one
            json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except UnicodeEncodeError:
        raise ValueError("a string escapes a lone surrogate, which is not Unicode") from None
    except UnicodeDecodeError as exc:
        raise ValueError(str(exc)) from None
    return parsed


def _parse(path: Path, raw: bytes) -> dict[str, Any]:
    """The header's JSON object."""
    try:
        header = strict_json(raw)
    except ValueError as exc:
        reason = str(exc).splitlines()[0]
        raise CheckpointError(f"{path}: header is not valid JSON ({reason})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file: its header is not a JSON object")
    return header


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INTEGER


def _entry(path: Path, name: str, value: object) -> TensorEntry:
    """One tensor's entry, whose dtype and shape fill its offsets exactly."""
    where = f"{path}: tensor {shown(name)}"
    if not isinstance(value, dict) or not all(key in value for key in ENTRY_KEYS):
        raise CheckpointError(f"{where}: expected an object of {', '.join(ENTRY_KEYS)}")
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if dtype not in DTYPE_BYTES:
        raise CheckpointError(
            f"{where}: dtype {shown(dtype)} is not one of {', '.join(DTYPE_BYTES)}"
        )
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(map(_is_count, shape)):
        raise CheckpointError(
            f"{where}: shape {shown(shape)} is not a list of at most {MAX_RANK} whole numbers"
        )
    if (
        not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets)))
        or offsets[0] > offsets[1]
    ):
        raise CheckpointError(f"{where}: data_offsets {shown(offsets)} are not [begin, end]")
    needed = math.prod(shape) * DTYPE_BYTES[dtype]
    if needed != offsets[1] - offsets[0]:
        raise CheckpointError(
            f"{where}: dtype {dtype} and shape {shape} need {needed:,} bytes, its data_offsets "
            f"{offsets} hold {offsets[1] - offsets[0]:,}"
        )
    return TensorEntry(dtype, tuple(shape), offsets[0], offsets[1])


def _check_tiling(path: Path, tensors: dict[str, TensorEntry], data: int) -> None:
    """The tensors' bytes tile the `data` bytes after the header: each starts where the one
    before ends, none overlaps another or runs past the file's end, none is left over."""
    reached, previous = 0, None
    for name, entry in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.end > data:
            raise CheckpointError(
                f"{path}: tensor {shown(name)} ends at byte {entry.end:,} of the data, which has "
                f"{data:,} bytes"
            )
        if entry.begin < reached:
            raise CheckpointError(
                f"{path}: tensor {shown(name)} overlaps tensor {shown(previous)} (its bytes "
                f"{entry.begin:,} to {entry.end:,} of the data)"
            )
        if entry.begin > reached:
            raise CheckpointError(
                f"{path}: tensor {shown(name)} starts at byte {entry.begin:,} of the data; bytes "
                f"from {reached:,} belong to no tensor"
            )
        reached, previous = entry.end, name
    if reached != data:
        raise CheckpointError(
            f"{path}: the data holds {data:,} bytes, its tensors {reached:,}; the rest belong "
            "to no tensor"
        )
