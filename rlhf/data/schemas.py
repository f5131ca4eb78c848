"""Parquet schemas and validating readers and writers.

Every dataset the pipeline passes between stages is a Parquet file with one of the schemas
below. Readers check every row, because a null or empty text found mid-training wastes the run:
they fail at once with the file, the row index and the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlhf.atomic import atomic_path
from rlhf.errors import PipelineError

_META = [pa.field("task", pa.string()), pa.field("source", pa.string())]

SFT_SCHEMA = pa.schema([pa.field("prompt", pa.string()), pa.field("response", pa.string()), *_META])
PREFERENCE_SCHEMA = pa.schema(
    [
        pa.field("prompt", pa.string()),
        pa.field("chosen", pa.string()),
        pa.field("rejected", pa.string()),
        *_META,
    ]
)
RANKED_SCHEMA = pa.schema(
    [
        pa.field("prompt", pa.string()),
        pa.field("responses", pa.list_(pa.string())),
        pa.field("ranks", pa.list_(pa.int32())),
        *_META,
    ]
)
PROMPT_SCHEMA = pa.schema([pa.field("prompt", pa.string()), *_META])
# Ranked rows as the pipeline collects them: the gold judge's score of each response, so
# accuracy against the clean ordering can be measured; empty for imported data (no judge).
COMPARISON_SCHEMA = RANKED_SCHEMA.append(pa.field("gold_scores", pa.list_(pa.float64())))

_TEXT_FIELDS = {"prompt", "response", "chosen", "rejected"}
_MAY_BE_EMPTY = {"gold_scores", "ranking"}  # ranking: a skipped item


class DataError(PipelineError, ValueError):
    """A dataset row that does not match its schema."""


def _row_error(path: str | Path, row: int, field: str, problem: str) -> DataError:
    return DataError(f"{path}: row {row}, field '{field}': {problem}")


def validate_rows(rows: Sequence[dict[str, Any]], schema: pa.Schema, path: str | Path) -> None:
    """Raise DataError for the first row that breaks the schema's rules."""
    for index, row in enumerate(rows):
        for field in schema:
            name = field.name
            if name not in row:
                raise _row_error(path, index, name, "missing")
            value = row[name]
            if value is None:
                raise _row_error(path, index, name, "is null")
            if pa.types.is_string(field.type):
                if not isinstance(value, str):
                    raise _row_error(path, index, name, f"expected text, got {value!r}")
                if name in _TEXT_FIELDS and not value.strip():
                    raise _row_error(path, index, name, "is empty")
            elif pa.types.is_list(field.type) and (
                not isinstance(value, (list, tuple)) or not (value or name in _MAY_BE_EMPTY)
            ):
                raise _row_error(path, index, name, f"expected a non-empty list, got {value!r}")
        if "ranks" in schema.names:
            _validate_ranking(row, index, path, allow_empty="gold_scores" in schema.names)


def _validate_ranking(row: dict[str, Any], index: int, path: str | Path, allow_empty: bool) -> None:
    """allow_empty: a policy's sample may be empty (it ended at once), an imported answer not."""
    responses, ranks = row["responses"], row["ranks"]
    if len(responses) < 2:
        raise _row_error(path, index, "responses", "needs at least 2 responses to rank")
    if len(ranks) != len(responses):
        raise _row_error(
            path, index, "ranks", f"has {len(ranks)} ranks for {len(responses)} responses"
        )
    for position, text in enumerate(responses):
        if not isinstance(text, str) or not (text.strip() or allow_empty):
            raise _row_error(path, index, "responses", f"item {position} is empty or not text")
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        raise _row_error(path, index, "ranks", f"expected non-negative integers, got {ranks!r}")
    if len(set(ranks)) < 2:
        raise _row_error(path, index, "ranks", "all responses share one rank: nothing to learn")
    gold = row.get("gold_scores")
    if gold and len(gold) != len(responses):
        raise _row_error(
            path, index, "gold_scores", f"has {len(gold)} scores for {len(responses)} responses"
        )


def write_rows(path: str | Path, rows: Sequence[dict[str, Any]], schema: pa.Schema) -> None:
    """Validate and write rows atomically as Parquet."""
    validate_rows(rows, schema, path)
    table = pa.Table.from_pylist(list(rows), schema=schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_rows(path: str | Path, schema: pa.Schema) -> list[dict[str, Any]]:
    """Read and validate a Parquet file; extra columns are dropped, types are checked."""
    if not Path(path).is_file():
        raise DataError(f"{path}: no such file; `dvc repro` writes it (or `rlhf import`)")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataError(f"{path}: not a readable Parquet file: {exc}") from None
    for field in schema:
        if field.name not in table.column_names:
            raise DataError(f"{path}: row 0, field '{field.name}': column missing")
        actual = table.schema.field(field.name).type
        if not _compatible(actual, field.type):
            raise DataError(
                f"{path}: field '{field.name}': column has type {actual}, expected {field.type}"
            )
    rows = table.select(schema.names).to_pylist()
    validate_rows(rows, schema, path)
    return rows


def _compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    if pa.types.is_list(expected):
        return pa.types.is_list(actual) and _compatible(actual.value_type, expected.value_type)
    if pa.types.is_integer(expected):
        return pa.types.is_integer(actual)
    return actual == expected or (pa.types.is_string(expected) and pa.types.is_large_string(actual))
