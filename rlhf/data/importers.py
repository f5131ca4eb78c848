"""Turn users' own JSONL or Parquet files into the pipeline's validated Parquet schemas.

Four kinds: demonstrations (`sft`), and three shapes of preference data that all become ranked
rows (rank 0 = best) for the reward model: plain pairs, Anthropic HH-RLHF transcripts, and the
ranked lists that annotation tools export.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlhf.data.schemas import (
    PREFERENCE_SCHEMA,
    RANKED_SCHEMA,
    SFT_SCHEMA,
    DataError,
    validate_rows,
)

ASSISTANT_TURN = "\n\nAssistant:"


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


def _meta(record: dict[str, Any], path: Path) -> dict[str, Any]:
    return {"task": record.get("task", "user"), "source": record.get("source", path.name)}


def import_sft(path: str | Path) -> list[dict[str, Any]]:
    """Demonstration rows (prompt, response); `task` defaults to "user", `source` to the file."""
    path = Path(path)
    rows = [
        {"prompt": r.get("prompt"), "response": r.get("response"), **_meta(r, path)}
        for r in read_records(path)
    ]
    validate_rows(rows, SFT_SCHEMA, path)
    return rows


def _pairs_to_ranked(pairs: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    validate_rows(pairs, PREFERENCE_SCHEMA, path)
    rows = [
        {
            "prompt": p["prompt"],
            "responses": [p["chosen"], p["rejected"]],
            "ranks": [0, 1],
            "task": p["task"],
            "source": p["source"],
        }
        for p in pairs
    ]
    validate_rows(rows, RANKED_SCHEMA, path)
    return rows


def import_pairwise(path: str | Path) -> list[dict[str, Any]]:
    """Rows (prompt, chosen, rejected) as ranked pairs."""
    path = Path(path)
    pairs = [
        {
            "prompt": r.get("prompt"),
            "chosen": r.get("chosen"),
            "rejected": r.get("rejected"),
            **_meta(r, path),
        }
        for r in read_records(path)
    ]
    return _pairs_to_ranked(pairs, path)


def split_transcript(transcript: str) -> tuple[str, str]:
    """An HH-RLHF transcript as (dialogue up to the last Assistant turn, final answer)."""
    cut = transcript.rfind(ASSISTANT_TURN)
    if cut < 0:
        raise ValueError("has no '\\n\\nAssistant:' turn")
    return transcript[:cut].strip(), transcript[cut + len(ASSISTANT_TURN) :].strip()


def import_hh(path: str | Path) -> list[dict[str, Any]]:
    """Anthropic HH-RLHF rows, where `chosen` and `rejected` are whole transcripts that share
    every turn but the final answer."""
    path = Path(path)
    pairs = []
    for index, record in enumerate(read_records(path)):
        parts = {}
        for field in ("chosen", "rejected"):
            text = record.get(field)
            if not isinstance(text, str) or not text.strip():
                raise DataError(
                    f"{path}: row {index}, field '{field}': missing or empty transcript"
                )
            try:
                parts[field] = split_transcript(text)
            except ValueError as exc:
                raise DataError(f"{path}: row {index}, field '{field}': {exc}") from exc
        if parts["chosen"][0] != parts["rejected"][0]:
            raise DataError(
                f"{path}: row {index}, field 'rejected': its dialogue before the final answer "
                "differs from the one in 'chosen'"
            )
        pairs.append(
            {
                "prompt": parts["chosen"][0],
                "chosen": parts["chosen"][1],
                "rejected": parts["rejected"][1],
                **_meta(record, path),
            }
        )
    return _pairs_to_ranked(pairs, path)


def import_ranked(path: str | Path) -> list[dict[str, Any]]:
    """Rows (prompt, responses: [{text, rank}, ...]) as annotation tools export them."""
    path = Path(path)
    rows = []
    for index, record in enumerate(read_records(path)):
        items = record.get("responses")
        if not isinstance(items, list) or not all(
            isinstance(i, dict) and "text" in i and "rank" in i for i in items
        ):
            raise DataError(
                f"{path}: row {index}, field 'responses': expected a list of {{text, rank}} objects"
            )
        rows.append(
            {
                "prompt": record.get("prompt"),
                "responses": [i["text"] for i in items],
                "ranks": [i["rank"] for i in items],
                **_meta(record, path),
            }
        )
    validate_rows(rows, RANKED_SCHEMA, path)
    return rows


IMPORTERS: dict[str, Callable[[str | Path], list[dict[str, Any]]]] = {
    "sft": import_sft,
    "pairwise": import_pairwise,
    "hh": import_hh,
    "ranked": import_ranked,
}
