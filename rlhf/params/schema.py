"""The machinery behind params.yaml's schema, apart from what it declares: a documented field
with bounds (`spec`), building a frozen dataclass from YAML with every value checked (`build`:
an unknown key, a wrong type or an out-of-range value fails at once with the key, the bad value
and what would be valid), and reading a built one back (`lookup`, `group_hash`, `describe`).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
import typing
from dataclasses import field
from typing import Any, Literal

from rlhf.errors import ParamsError

# The largest seed: what every random-number generator the pipeline seeds accepts, with room
# for the offsets derived from it (seed * 100_003 + epoch must stay a 64-bit integer).
MAX_SEED = 2**32 - 1
# The bound on every int field that names no tighter one: int32, the range torch's index
# arithmetic and every size here stay within.
MAX_INT = 2**31 - 1
# A number as YAML 1.1 (PyYAML) fails to read one: `1e-3` or `5E4`, without a dot, is text.
_EXPONENT_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def spec(
    default: Any,
    doc: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A documented field with optional numeric bounds, checked at load time."""
    bounds = {"ge": ge, "gt": gt, "le": le, "lt": lt}
    metadata = {"doc": doc, **{k: v for k, v in bounds.items() if v is not None}}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _describe_type(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return f"a list of {typing.get_args(hint)[0].__name__}"
    return hint.__name__


def _as_number(value: Any, hint: Any) -> Any:
    """What a user meant by a number YAML read otherwise: `1` for a float field, and `1e-3`
    (text to PyYAML, which wants `1.0e-3`) for a float or, when whole, an int field."""
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (float, int) and isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value):
        number = float(value)
        if hint is float:
            return number
        if number.is_integer():
            return int(number)
    return value


def _check_value(key: str, value: Any, hint: Any, meta: dict[str, Any], source: str) -> Any:
    def fail(reason: str) -> ParamsError:
        return ParamsError(f"{source}: {key} = {value!r} {reason}")

    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            hint_text = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            suffix = f" (did you mean {hint_text[0]!r}?)" if hint_text else ""
            raise fail(f"is not one of {', '.join(repr(c) for c in choices)}{suffix}")
        return value
    if origin is tuple:  # a list: each element checked as a value of its own, bounds included
        if not isinstance(value, list):
            raise fail(f"has the wrong type: expected {_describe_type(hint)}")
        element = typing.get_args(hint)[0]
        return tuple(
            _check_value(f"{key}[{i}]", v, element, meta, source) for i, v in enumerate(value)
        )
    value = _as_number(value, hint)
    if not isinstance(value, hint) or (hint is not bool and isinstance(value, bool)):
        raise fail(f"has the wrong type: expected {_describe_type(hint)}")
    if hint is float and not math.isfinite(value):
        raise fail("is not a finite number")
    if hint is int and "le" not in meta and "lt" not in meta:
        meta = {**meta, "le": MAX_INT}
    for bound, ok in (
        ("ge", lambda b: value >= b),
        ("gt", lambda b: value > b),
        ("le", lambda b: value <= b),
        ("lt", lambda b: value < b),
    ):
        if bound in meta and not ok(meta[bound]):
            symbol = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[bound]
            raise fail(f"is out of range: must be {symbol} {meta[bound]}")
    return value


def build(cls: type, raw: Any, prefix: str, source: str) -> Any:
    if not isinstance(raw, dict):
        where = prefix.rstrip(".") or "top level"
        raise ParamsError(f"{source}: {where} must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for name, value in raw.items():
        key = f"{prefix}{name}"
        if name not in fields:
            close = difflib.get_close_matches(str(name), list(fields), n=1)
            suffix = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            raise ParamsError(
                f"{source}: unknown key {key!r}{suffix}; valid keys: "
                + ", ".join(f"{prefix}{n}" for n in fields)
            )
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = build(hint, value, f"{key}.", source)
        else:
            values[name] = _check_value(key, value, hint, dict(fields[name].metadata), source)
    try:
        return cls(**values)
    except ParamsError as exc:  # a check across fields, which knows no file name
        raise ParamsError(f"{source}: {exc}") from None


def lookup(params: Any, key: str) -> Any:
    """A group (`model`) or one key in it (`model.init`) of a params object, as dvc.yaml's
    params name them."""
    value: Any = params
    for part in key.split("."):
        value = getattr(value, part)
    return value


def group_hash(params: Any, *groups: str) -> str:
    """A short fingerprint of the named groups or keys, stored in checkpoints to tie them to
    params."""
    payload = {g: _to_plain(lookup(params, g)) for g in groups}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return list(value)
    return value


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, Any]]:
    """(key, doc, default) for every field of a params dataclass, nested groups by dotted key."""
    rows: list[tuple[str, str, Any]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            rows.extend(describe(hint, f"{prefix}{f.name}."))
        else:
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            rows.append((f"{prefix}{f.name}", f.metadata["doc"], _to_plain(default)))
    return rows
