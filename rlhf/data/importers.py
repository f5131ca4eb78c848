"""Turn users' own JSONL or Parquet files into the pipeline's validated Parquet schemas.

Four kinds: demonstrations (`sft`), and three shapes of preference data that all become ranked
rows (rank 0 = best) for the reward model: plain pairs, Anthropic HH-RLHF transcripts, and the
ranked lists that annotation tools export.

Each row is checked before anything is written: its JSON, its UTF-8 (the byte offset of a bad
sequence is named), its size (`MAX_ROW_BYTES`), its fields, HH transcripts that must end with
the Assistant's answer, and pairs whose chosen and rejected answers are the same text.
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
HUMAN_TURN = "\n\nHuman:"
# The largest row accepted, in bytes of UTF-8 text: far beyond what any context a model here
# reads holds (32,768 tokens are about 130 KB), so a bigger row is a mis-joined file or a
# document pasted whole, not a demonstration. Rejected, never silently truncated.
MAX_ROW_BYTES = 1_000_000


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file; invalid UTF-8 is an error naming its line and the
    byte offset in the file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    lines, offset = [], 0
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{path}: line {number}: invalid UTF-8 at byte offset {offset + exc.start} "
                f"({exc.reason}); save the file as UTF-8"
            ) from None
        offset += len(raw) + 1
    return lines


def _check_size(path: Path, row: int, size: int) -> None:
    if size > MAX_ROW_BYTES:
        raise DataError(
            f"{path}: row {row}: {size:,} bytes, over the limit of {MAX_ROW_BYTES:,} bytes per "
            "row; split or shorten it"
        )


def _text_bytes(record: dict[str, Any]) -> int:
    """UTF-8 bytes of a record's text, nested lists and objects included."""
    return len(json.dumps(record, ensure_ascii=False).encode())


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of a `.jsonl` or `.parquet` file, each a dict; row numbers start at 0."""
    path = Path(path)
    if path.suffix not in (".jsonl", ".json", ".parquet"):
        raise DataError(f"{path}: expected a .jsonl or .parquet file")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix == ".parquet":
        try:
            records = pq.read_table(path).to_pylist()
        except (OSError, pa.ArrowInvalid) as exc:
            raise DataError(f"{path}: not a readable Parquet file: {exc}") from None
        for index, record in enumerate(records):
            _check_size(path, index, _text_bytes(record))
        if not records:
            raise DataError(f"{path}: no rows")
        return records
    records = []
    for index, line in enumerate(read_lines(path)):
        if not line.strip():
            continue
        _check_size(path, len(records), len(line.encode()))
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
    for index, pair in enumerate(pairs):
        if pair["chosen"].strip() == pair["rejected"].strip():
            raise DataError(
                f"{path}: row {index}, field 'rejected': the same text as 'chosen'; a pair of "
                "identical answers teaches nothing"
            )
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
    if HUMAN_TURN in transcript[cut:]:
        raise ValueError(
            "ends with a Human turn; a transcript must end with the Assistant's answer"
        )
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
        texts = [i["text"] for i in items]
        if len({t.strip() if isinstance(t, str) else repr(t) for t in texts}) < len(texts):
            raise DataError(
                f"{path}: row {index}, field 'responses': the same text appears twice; "
                "identical answers cannot be ranked apart"
            )
        rows.append(
            {
                "prompt": record.get("prompt"),
                "responses": texts,
                "ranks": [i["rank"] for i in items],
                **_meta(record, path),
            }
        )
    validate_rows(rows, RANKED_SCHEMA, path)
    return rows


def best_answers(ranked: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Demonstrations from comparisons: each row's best-ranked answer (the first of tied
    bests), for data sets such as HH-RLHF that come without demonstrations, whose chosen
    answers are the customary SFT targets."""
    return [
        {
            "prompt": row["prompt"],
            "response": row["responses"][row["ranks"].index(min(row["ranks"]))],
            "task": row["task"],
            "source": row["source"],
        }
        for row in ranked
    ]


IMPORTERS: dict[str, Callable[[str | Path], list[dict[str, Any]]]] = {
    "sft": import_sft,
    "pairwise": import_pairwise,
    "hh": import_hh,
    "ranked": import_ranked,
}
