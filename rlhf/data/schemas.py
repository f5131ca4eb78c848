"""Parquet schemas and validating readers and writers.

Every dataset the pipeline passes between stages is a Parquet file with one of the schemas
below. Readers and writers hold every row to the one row rule (`rlhf.data.rows`), because a
null, empty or giant text found mid-training wastes the run: they fail at once with the file,
the row (counted from 1) and the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlhf.atomic import atomic_path
from rlhf.data.rows import OPTIONAL_FIELDS, DataError, RowError, check_row

_META = [pa.field("task", pa.string()), pa.field("source", pa.string())]
# The right final answer where a prompt has one (`rlhf.algorithms.answer_check`), null where it
# has none: what the `check:EXTRACTOR` reward and judge compare answers with.
_REFERENCE = pa.field("reference", pa.string())

SFT_SCHEMA = pa.schema(
    [pa.field("prompt", pa.string()), pa.field("response", pa.string()), _REFERENCE, *_META]
)
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
PROMPT_SCHEMA = pa.schema([pa.field("prompt", pa.string()), _REFERENCE, *_META])
# Ranked rows as the pipeline collects them: the gold judge's score of each response, so
# accuracy against the clean ordering can be measured; empty for imported data (no judge).
COMPARISON_SCHEMA = RANKED_SCHEMA.append(pa.field("gold_scores", pa.list_(pa.float64())))


def validate_rows(rows: Sequence[dict[str, Any]], schema: pa.Schema, path: str | Path) -> None:
    """Raise DataError for the first row that breaks the row rule (`rlhf.data.rows`)."""
    for number, row in enumerate(rows, start=1):
        try:
            check_row(row, schema)
        except RowError as exc:
            raise exc.at(path, number) from None


def write_rows(path: str | Path, rows: Sequence[dict[str, Any]], schema: pa.Schema) -> None:
    """Validate and write rows atomically as Parquet."""
    validate_rows(rows, schema, path)
    table = pa.Table.from_pylist(list(rows), schema=schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_rows(path: str | Path, schema: pa.Schema) -> list[dict[str, Any]]:
    """Read and validate a Parquet file; extra columns are dropped, types are checked, and an
    optional column the file lacks (one written before it existed) is read as nulls."""
    if not Path(path).is_file():
        raise DataError(f"{path}: no such file; `dvc repro` writes it (or `rlhf import`)")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataError(f"{path}: not a readable Parquet file: {exc}") from None
    for field in schema:
        optional = field.name in OPTIONAL_FIELDS
        if field.name not in table.column_names and optional:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
        elif field.name not in table.column_names:
            raise DataError(f"{path}: field '{field.name}': column missing")
        actual = table.schema.field(field.name).type
        if not (_compatible(actual, field.type) or (optional and pa.types.is_null(actual))):
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
