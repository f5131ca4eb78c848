"""The one rule every row of data meets, wherever it is read.

The importers, `prepare` on `data/raw/`, `rlhf generate --file`, `rlhf score --file` and every
stage's Parquet inputs check their rows here, so a row one path refuses no other lets through:

- its size, as UTF-8 JSON text, is at most `MAX_ROW_BYTES`;
- every field its schema names is present ("missing" otherwise), not null, and of its type,
  but an optional one (a prompt's `reference` answer), which may be absent or null;
- a text the pipeline learns from or checks against (prompt, response, chosen, rejected,
  reference) is not blank;
- a ranking holds two or more answers, one non-negative whole rank each, not all equal; an
  answer a person or a data set gave is neither blank nor the same text as another.

A check raises `RowError`, which names the field and the problem but knows neither the file nor
the row: the reader that does turns it into a `DataError` (`RowError.at`), or, where the user
asked to skip bad rows, sets the row aside with its reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from rlhf.errors import PipelineError

# The largest row accepted, in bytes of UTF-8 text: far beyond what any context a model here
# reads holds (32,768 tokens are about 130 KB), so a bigger row is a mis-joined file or a
# document pasted whole, not a demonstration. Rejected, never silently truncated.
MAX_ROW_BYTES = 1_000_000

_TEXT_FIELDS = {"prompt", "response", "chosen", "rejected", "reference"}
# fields a row may leave out: a prompt has a reference answer only where one answer is right
OPTIONAL_FIELDS = {"reference"}
_MAY_BE_EMPTY = {"gold_scores", "ranking"}  # ranking: a skipped item
_SHOWN_CHARS = 60  # of a bad value quoted in an error, which stays one short line


class DataError(PipelineError, ValueError):
    """A data file, or a row of one, that the pipeline cannot use."""


class RowError(Exception):
    """What is wrong with one row: the field (None for the row as a whole) and the problem."""

    def __init__(self, field: str | None, problem: str) -> None:
        super().__init__(problem if field is None else f"field '{field}': {problem}")
        self.field = field

    def at(self, path: str | Path, row: int) -> DataError:
        """The error naming the file and the row (counted from 1, as the user counts)."""
        return DataError(f"{path}: row {row}{':' if self.field is None else ','} {self}")


def _shown(value: Any) -> str:
    """A value as an error quotes it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else f"{text[: _SHOWN_CHARS - 3]}..."


def _json_bytes(value: Any) -> int:
    """UTF-8 bytes of a value written as JSON: a row's size however its file stores it."""
    return len(json.dumps(value, ensure_ascii=False, default=str).encode())


def check_size(row: dict[str, Any]) -> None:
    """Refuse a row over `MAX_ROW_BYTES`, naming the field that holds the most of it."""
    size = _json_bytes(row)
    if size > MAX_ROW_BYTES:
        biggest = max(row, key=lambda name: _json_bytes(row[name]), default=None)
        raise RowError(
            biggest,
            f"the row is {size:,} bytes, over the limit of {MAX_ROW_BYTES:,} bytes per row; "
            "split or shorten it",
        )


def check_text(row: dict[str, Any], name: str) -> str:
    """The text in `row[name]`: present, not null, a string, and not blank where the pipeline
    learns from it."""
    if name not in row:
        raise RowError(name, "missing")
    value = row[name]
    if value is None:
        raise RowError(name, "is null")
    if not isinstance(value, str):
        raise RowError(name, f"expected text, got {_shown(value)}")
    if name in _TEXT_FIELDS and not value.strip():
        raise RowError(name, "is empty")
    return value


def check_fields(row: dict[str, Any], schema: pa.Schema) -> None:
    """Every field of the schema present, not null, of its type (an optional one absent or
    null, or of its type); rankings well formed."""
    for field in schema:
        if field.name in OPTIONAL_FIELDS and row.get(field.name) is None:
            continue
        if pa.types.is_string(field.type):
            check_text(row, field.name)
            continue
        if field.name not in row:
            raise RowError(field.name, "missing")
        value = row[field.name]
        if value is None:
            raise RowError(field.name, "is null")
        if pa.types.is_list(field.type) and (
            not isinstance(value, (list, tuple)) or not (value or field.name in _MAY_BE_EMPTY)
        ):
            raise RowError(field.name, f"expected a non-empty list, got {_shown(value)}")
    if "ranks" in schema.names:
        _check_ranking(row, sampled="gold_scores" in schema.names)


def check_row(row: dict[str, Any], schema: pa.Schema) -> None:
    """The whole rule: size, then fields."""
    check_size(row)
    check_fields(row, schema)


def _check_ranking(row: dict[str, Any], sampled: bool) -> None:
    """sampled: a policy's sample may be empty (it ended at once) or repeat another; an
    imported answer may not, since identical answers cannot be ranked apart."""
    responses, ranks = row["responses"], row["ranks"]
    if len(responses) < 2:
        raise RowError("responses", "needs at least 2 responses to rank")
    if len(ranks) != len(responses):
        raise RowError("ranks", f"has {len(ranks)} ranks for {len(responses)} responses")
    for position, text in enumerate(responses):
        if not isinstance(text, str) or not (text.strip() or sampled):
            raise RowError("responses", f"item {position} is empty or not text")
    if not sampled and len({text.strip() for text in responses}) < len(responses):
        raise RowError(
            "responses", "the same text appears twice; identical answers cannot be ranked apart"
        )
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        raise RowError("ranks", f"expected non-negative integers, got {_shown(ranks)}")
    if len(set(ranks)) < 2:
        raise RowError("ranks", "all responses share one rank: nothing to learn")
    gold = row.get("gold_scores")
    if gold and len(gold) != len(responses):
        raise RowError("gold_scores", f"has {len(gold)} scores for {len(responses)} responses")
