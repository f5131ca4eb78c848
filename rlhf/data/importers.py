"""Turn users' own JSONL or Parquet files into the pipeline's validated Parquet schemas.

Six kinds: demonstrations (`sft`), and five shapes of preference data that all become ranked
rows (rank 0 = best, equal ranks tie) for the reward model: plain pairs, Anthropic HH-RLHF
transcripts, the ranked lists that annotation tools export, UltraFeedback's scored
completions, and Label Studio's export of a ranking project.

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
        raise DataError(f"{path}: expected a .jsonl, .json or .parquet file")
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
    lines = read_lines(path)
    if path.suffix == ".json" and "".join(lines).lstrip().startswith("["):
        return _json_array(path, "\n".join(lines))
    records = []
    for index, line in enumerate(lines):
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


def _json_array(path: Path, text: str) -> list[dict[str, Any]]:
    """A `.json` file holding one array of objects, as Label Studio exports tasks."""
    try:
        records = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from exc
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise DataError(f"{path}: row {index}: expected a JSON object")
        _check_size(path, index, _text_bytes(record))
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


SCORE_FIELDS = ("overall_score", "score")  # UltraFeedback's, then the generic name
TEXT_FIELDS = ("response", "text")


def _first_field(item: dict[str, Any], names: tuple[str, ...]) -> Any:
    return next((item[n] for n in names if item.get(n) is not None), None)


def ranks_of(scores: list[float]) -> list[int]:
    """Rank 0 for the highest score, equal scores sharing a rank (a tie)."""
    levels = sorted(set(scores), reverse=True)
    return [levels.index(score) for score in scores]


def import_ultrafeedback(path: str | Path) -> list[dict[str, Any]]:
    """UltraFeedback-style rows: a prompt (`prompt`, or UltraFeedback's `instruction`) and
    several `completions`, each a text (`response` or `text`) with a score (`overall_score`
    or `score`), higher is better. Ranks follow the scores, equal scores tie; a completion
    repeated with the same score counts once. A row whose completions all share one score
    holds no preference and is left out."""
    path = Path(path)
    rows = []
    for index, record in enumerate(read_records(path)):
        where = f"{path}: row {index}, field 'completions"
        items = record.get("completions")
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise DataError(f"{where}': expected a list of {{response, overall_score}} objects")
        scored: dict[str, float] = {}
        for number, item in enumerate(items):
            text, score = _first_field(item, TEXT_FIELDS), _first_field(item, SCORE_FIELDS)
            if not isinstance(text, str) or not text.strip():
                raise DataError(f"{where}[{number}]': no text in 'response' or 'text'")
            if isinstance(score, bool) or not isinstance(score, int | float):
                raise DataError(f"{where}[{number}]': no number in 'overall_score' or 'score'")
            if scored.setdefault(text, float(score)) != score:
                raise DataError(
                    f"{where}[{number}]': the same text as an earlier completion with another score"
                )
        if len(set(scored.values())) < 2:
            continue
        rows.append({
            "prompt": _first_field(record, ("prompt", "instruction")),
            "responses": list(scored),
            "ranks": ranks_of(list(scored.values())),
            **_meta(record, path),
        })  # fmt: skip
    if not rows:
        raise DataError(f"{path}: every row's completions share one score; nothing to learn")
    validate_rows(rows, RANKED_SCHEMA, path)
    return rows


def _ranker_levels(value: dict[str, Any]) -> list[list[str]]:
    """Item ids by rank level from a Ranker result: one list is an order (each id its own
    level); buckets are levels in the order the project defines them, ids within one tie.
    Ids are compared as text: an export may hold them as numbers."""
    lists = {k: v for k, v in value.get("ranker", {}).items() if k != "_"}
    if len(lists) == 1:
        return [[str(item)] for item in next(iter(lists.values()))]
    return [[str(item) for item in ids] for ids in lists.values() if ids]


def import_label_studio(path: str | Path) -> list[dict[str, Any]]:
    """Label Studio's JSON export of a ranking project (a List of answers and a Ranker): each
    task's `data` has the `prompt` and the answers as a list of {id, body} items (`text` or
    `title` where `body` is absent); each annotation's Ranker result orders their ids, or sorts
    them into buckets that are tied levels. One ranked row per annotation, so several labelers'
    rankings of one task all count; cancelled annotations and unlabeled tasks are skipped."""
    path = Path(path)
    rows = []
    for index, task in enumerate(read_records(path)):
        data = task.get("data")
        if not isinstance(data, dict):
            raise DataError(f"{path}: row {index}, field 'data': missing; is this a Label "
                            "Studio JSON export?")  # fmt: skip
        lists = [v for v in data.values() if isinstance(v, list) and v and
                 all(isinstance(i, dict) and "id" in i for i in v)]  # fmt: skip
        if not lists:
            raise DataError(f"{path}: row {index}, field 'data': no list of {{id, body}} items")
        texts = {str(i["id"]): _first_field(i, ("body", "text", "title")) for i in lists[0]}
        annotations = [a for a in task.get("annotations") or [] if not a.get("was_cancelled")]
        for number, annotation in enumerate(annotations):
            where = f"{path}: row {index}, field 'annotations[{number}].result'"
            rankers = [
                r["value"] for r in annotation.get("result", []) if r.get("type") == "ranker"
            ]
            if not rankers:
                raise DataError(f"{where}: no ranker result")
            levels = _ranker_levels(rankers[0])
            ranked = {item: level for level, ids in enumerate(levels) for item in ids}
            unknown = set(ranked) - set(texts)
            if unknown:
                raise DataError(f"{where}: ids {sorted(unknown)} are not among the task's items")
            rows.append({
                "prompt": data.get("prompt"),
                "responses": [texts[item] for item in ranked],
                "ranks": list(ranked.values()),
                "task": data.get("task", "user"),
                "source": path.name,
            })  # fmt: skip
    if not rows:
        raise DataError(f"{path}: no task has a ranking annotation")
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
    "ultrafeedback": import_ultrafeedback,
    "label-studio": import_label_studio,
}
