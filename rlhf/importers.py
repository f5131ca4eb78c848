"""Turn users' own JSONL or Parquet files into the pipeline's validated Parquet schemas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlhf.data import SFT_SCHEMA, DataError, validate_rows


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of a `.jsonl` or `.parquet` file, each a dict; row numbers start at 0."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            return pq.read_table(path).to_pylist()
        except (OSError, pa.ArrowInvalid) as exc:
            raise DataError(f"{path}: not a readable Parquet file: {exc}") from exc
    if path.suffix not in (".jsonl", ".json"):
        raise DataError(f"{path}: expected a .jsonl or .parquet file")
    records = []
    for index, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: row {len(records)}: not valid JSON ({exc})") from exc
        if not isinstance(record, dict):
            raise DataError(
                f"{path}: row {len(records)}: expected a JSON object (line {index + 1})"
            )
        records.append(record)
    if not records:
        raise DataError(f"{path}: no rows")
    return records


def import_sft(path: str | Path) -> list[dict[str, Any]]:
    """Demonstration rows (prompt, response); `task` defaults to "user", `source` to the file."""
    rows = [
        {
            "prompt": record.get("prompt"),
            "response": record.get("response"),
            "task": record.get("task", "user"),
            "source": record.get("source", Path(path).name),
        }
        for record in read_records(path)
    ]
    validate_rows(rows, SFT_SCHEMA, path)
    return rows
