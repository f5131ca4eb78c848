"""Turn users' own JSONL or Parquet files into the pipeline's validated Parquet schemas.

Eight kinds: demonstrations (`sft`), questions with one right answer (`gsm8k`, `qa`: the answer
is the demonstration and its final answer the prompt's reference, what `check:EXTRACTOR`
rewards), and five shapes of preference data that all become ranked
rows (rank 0 = best, equal ranks tie) for the reward model: plain pairs, Anthropic HH-RLHF
transcripts, the ranked lists that annotation tools export (or the pipeline's own flat
`responses` and `ranks`), UltraFeedback's scored completions, and Label Studio's export of a
ranking project.

Each row is checked before anything is written: by the one row rule (`rlhf.data.rows`: size,
fields, types), and by its kind's own checks: its JSON, HH transcripts that must end with the
Assistant's answer, pairs whose chosen and rejected answers are the same text, scores that are
numbers. A bad row stops the import with the file, the row (from 1; in a JSONL file, its line)
and the field; or, with `skip_bad_rows`, it is set aside with its reason, so one bad row in a
public data set of thousands costs that row alone. A file that cannot be read as rows at all
(not UTF-8, where the byte offset is named; not Parquet; no rows) is refused whole.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlhf.algorithms.answer_check import GSM8K_MARK, after_gsm8k_mark
from rlhf.atomic import write_text
from rlhf.data.rows import RowError, check_fields, check_size, check_text
from rlhf.data.schemas import PREFERENCE_SCHEMA, RANKED_SCHEMA, SFT_SCHEMA, DataError

ASSISTANT_TURN = "\n\nAssistant:"
HUMAN_TURN = "\n\nHuman:"


@dataclass(frozen=True)
class SourceRow:
    """One row of a user's file as read, before any check."""

    number: int  # from 1, as the user counts; in a JSONL file, its line
    value: Any  # the JSON value or Parquet row; a JSONL line's text where it is not JSON
    unparsed: str | None = None  # why a JSONL line is not JSON


@dataclass(frozen=True)
class Rejected:
    """A row that `skip_bad_rows` left out: its number, why, and the row as it was read."""

    row: int
    reason: str
    record: Any


@dataclass(frozen=True)
class Imported:
    """What an import gives: the rows to write, and those `skip_bad_rows` set aside."""

    rows: list[dict[str, Any]]
    rejected: list[Rejected]


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


def read_records(path: str | Path) -> list[SourceRow]:
    """The rows of a `.jsonl`, `.json` or `.parquet` file; a file with none is refused."""
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
        rows = [SourceRow(number, record) for number, record in enumerate(records, start=1)]
    else:
        lines = read_lines(path)
        if path.suffix == ".json" and "".join(lines).lstrip().startswith("["):
            rows = _json_array(path, "\n".join(lines))
        else:
            rows = [_jsonl_row(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def _jsonl_row(number: int, line: str) -> SourceRow:
    try:
        return SourceRow(number, json.loads(line))
    except json.JSONDecodeError as exc:
        return SourceRow(number, line, f"not valid JSON ({exc})")


def _json_array(path: Path, text: str) -> list[SourceRow]:
    """A `.json` file holding one array of objects, as Label Studio exports tasks."""
    try:
        records = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from exc
    return [SourceRow(number, record) for number, record in enumerate(records, start=1)]


def record_of(row: SourceRow) -> dict[str, Any]:
    """The row as an object within the size limit, or the RowError that says why not."""
    if row.unparsed is not None:
        raise RowError(None, row.unparsed)
    if not isinstance(row.value, dict):
        raise RowError(None, "expected a JSON object")
    check_size(row.value)
    return row.value


def read_prompts(path: str | Path) -> list[str]:
    """The prompts of a text file, one a line, blank lines skipped, each line held to the size
    limit of the row rule. A file without one is refused: answering nothing is never asked."""
    prompts = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            check_size({"prompt": line})
        except RowError as exc:
            raise exc.at(path, number) from None
        prompts.append(line)
    if not prompts:
        raise DataError(f"{path}: holds no prompts; write one prompt a line")
    return prompts


def _meta(record: dict[str, Any], source: str) -> dict[str, Any]:
    return {"task": record.get("task", "user"), "source": record.get("source", source)}


def _present(record: dict[str, Any], *names: str) -> dict[str, Any]:
    """The fields of `record` among `names`; an absent one stays absent, so that the row rule
    calls it missing rather than null."""
    return {name: record[name] for name in names if name in record}


def _sft(record: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """A demonstration (prompt, response, and a `reference` answer where it has one); `task`
    defaults to "user", `source` to the file."""
    return [{**_present(record, "prompt", "response", "reference"), **_meta(record, source)}]


CALCULATOR_NOTE = re.compile(r"<<[^<>]*>>")  # GSM8K's `<<48/2=24>>` calculator annotations


def _gsm8k(record: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """A GSM8K row: a `question`, and an `answer` that reasons and ends with `#### N`. The
    answer, its calculator annotations removed, is the demonstration (so SFT learns to end with
    `#### N`); N is the reference."""
    question, answer = check_text(record, "question"), check_text(record, "answer")
    final = after_gsm8k_mark(answer)
    if final is None or not final.strip():
        raise RowError("answer", f"has no final answer after '{GSM8K_MARK}'")
    task = record.get("task", "gsm8k")
    return [
        {
            "prompt": question,
            "response": CALCULATOR_NOTE.sub("", answer),
            "reference": final,
            **_meta({**record, "task": task}, source),
        }
    ]


def _qa(record: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """A question (`prompt`, or `question`) with its short `answer`: the answer is both the
    demonstration and the reference."""
    if "prompt" not in record and "question" not in record:
        raise RowError("prompt", "missing")
    prompt = check_text(record, "prompt" if "prompt" in record else "question")
    answer = check_text(record, "answer")
    if not answer.strip():
        raise RowError("answer", "is empty")
    return [
        {
            "prompt": prompt,
            "response": answer,
            "reference": answer,
            **_meta({**record, "task": record.get("task", "qa")}, source),
        }
    ]


def _ranked_pair(pair: dict[str, Any]) -> list[dict[str, Any]]:
    check_fields(pair, PREFERENCE_SCHEMA)
    if pair["chosen"].strip() == pair["rejected"].strip():
        raise RowError(
            "rejected", "the same text as 'chosen'; a pair of identical answers teaches nothing"
        )
    return [
        {
            "prompt": pair["prompt"],
            "responses": [pair["chosen"], pair["rejected"]],
            "ranks": [0, 1],
            "task": pair["task"],
            "source": pair["source"],
        }
    ]


def _pairwise(record: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """A pair (prompt, chosen, rejected) as a ranked pair."""
    return _ranked_pair(
        {**_present(record, "prompt", "chosen", "rejected"), **_meta(record, source)}
    )


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


def _hh(record: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """An Anthropic HH-RLHF row, where `chosen` and `rejected` are whole transcripts that share
    every turn but the final answer."""
    parts = {}
    for field in ("chosen", "rejected"):
        text = check_text(record, field)
        try:
            parts[field] = split_transcript(text)
        except ValueError as exc:
            raise RowError(field, str(exc)) from None
    if parts["chosen"][0] != parts["rejected"][0]:
        raise RowError(
            "rejected", "its dialogue before the final answer differs from the one in 'chosen'"
        )
    return _ranked_pair(
        {
            "prompt": parts["chosen"][0],
            "chosen": parts["chosen"][1],
            "rejected": parts["rejected"][1],
            **_meta(record, source),
        }
    )


def _ranked(record: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """A ranking in either shape: `responses` as [{text, rank}] objects, as annotation tools
    export them, or as texts beside `ranks` [int], as the pipeline's comparisons hold them."""
    items = record.get("responses")
    if isinstance(items, list) and items and all(isinstance(i, dict) for i in items):
        ranking = _ranking_of_objects(items)
    else:
        ranking = _present(record, "responses", "ranks")
    return [{**_present(record, "prompt"), **ranking, **_meta(record, source)}]


def _ranking_of_objects(items: list[dict[str, Any]]) -> dict[str, list[Any]]:
    for number, item in enumerate(items):
        for key in ("text", "rank"):
            if key not in item:
                raise RowError(f"responses[{number}]", f"has no '{key}'")
    return {"responses": [i["text"] for i in items], "ranks": [i["rank"] for i in items]}


SCORE_FIELDS = ("overall_score", "score")  # UltraFeedback's, then the generic name
TEXT_FIELDS = ("response", "text")


def _first_field(item: dict[str, Any], names: tuple[str, ...]) -> tuple[str | None, Any]:
    """The first of `names` that `item` holds a value in, with the value; (None, None) if none."""
    return next(((n, item[n]) for n in names if item.get(n) is not None), (None, None))


def ranks_of(scores: list[float]) -> list[int]:
    """Rank 0 for the highest score, equal scores sharing a rank (a tie)."""
    levels = sorted(set(scores), reverse=True)
    return [levels.index(score) for score in scores]


def _ultrafeedback(record: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """An UltraFeedback-style row: a prompt (`prompt`, or UltraFeedback's `instruction`) and
    several `completions`, each a text (`response` or `text`) with a score (`overall_score`
    or `score`), higher is better. Ranks follow the scores, equal scores tie; a completion
    repeated with the same score counts once. A row whose completions all share one score
    holds no preference and gives no row."""
    if "completions" not in record:
        raise RowError("completions", "missing")
    items = record["completions"]
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise RowError("completions", "expected a list of {response, overall_score} objects")
    scored: dict[str, tuple[str, float]] = {}  # by text as compared (stripped): as given, score
    for number, item in enumerate(items):
        where = f"completions[{number}]"
        _, text = _first_field(item, TEXT_FIELDS)
        name, score = _first_field(item, SCORE_FIELDS)
        if not isinstance(text, str) or not text.strip():
            raise RowError(where, "no text in 'response' or 'text'")
        if isinstance(score, bool) or not isinstance(score, int | float):
            raise RowError(where, "no number in 'overall_score' or 'score'")
        if not math.isfinite(score):
            raise RowError(
                where, f"'{name}' is {'NaN' if math.isnan(score) else score}, not a score"
            )
        earlier = scored.get(text.strip())
        if earlier is not None and earlier[1] != score:
            raise RowError(where, "the same text as an earlier completion with another score")
        scored.setdefault(text.strip(), (text, float(score)))  # a repeat is one answer
    if len({score for _, score in scored.values()}) < 2:
        return []
    name, prompt = _first_field(record, ("prompt", "instruction"))
    return [
        {
            **({"prompt": prompt} if name else _present(record, "prompt")),
            "responses": [text for text, _ in scored.values()],
            "ranks": ranks_of([score for _, score in scored.values()]),
            **_meta(record, source),
        }
    ]


def _ranker_levels(value: dict[str, Any]) -> list[list[str]]:
    """Item ids by rank level from a Ranker result: one list is an order (each id its own
    level); buckets are levels in the order the project defines them, ids within one tie.
    Ids are compared as text: an export may hold them as numbers."""
    lists = {k: v for k, v in value.get("ranker", {}).items() if k != "_"}
    if len(lists) == 1:
        return [[str(item)] for item in next(iter(lists.values()))]
    return [[str(item) for item in ids] for ids in lists.values() if ids]


def _label_studio(task: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """A task of Label Studio's JSON export of a ranking project (a List of answers and a
    Ranker): its `data` has the `prompt` and the answers as a list of {id, body} items (`text`
    or `title` where `body` is absent); each annotation's Ranker result orders their ids, or
    sorts them into buckets that are tied levels. One ranked row per annotation, so several
    labelers' rankings of one task all count; cancelled annotations are skipped, and an
    unlabeled task gives no row."""
    data = task.get("data")
    if not isinstance(data, dict):
        raise RowError("data", "missing; is this a Label Studio JSON export?")
    lists = [
        v
        for v in data.values()
        if isinstance(v, list) and v and all(isinstance(i, dict) and "id" in i for i in v)
    ]
    if not lists:
        raise RowError("data", "no list of {id, body} items")
    texts = {str(i["id"]): _first_field(i, ("body", "text", "title"))[1] for i in lists[0]}
    annotations = [a for a in task.get("annotations") or [] if not a.get("was_cancelled")]
    rows = []
    for number, annotation in enumerate(annotations):
        where = f"annotations[{number}].result"
        rankers = [r["value"] for r in annotation.get("result", []) if r.get("type") == "ranker"]
        if not rankers:
            raise RowError(where, "no ranker result")
        levels = _ranker_levels(rankers[0])
        ranked = {item: level for level, ids in enumerate(levels) for item in ids}
        unknown = set(ranked) - set(texts)
        if unknown:
            raise RowError(where, f"ids {sorted(unknown)} are not among the task's items")
        rows.append(
            {
                **_present(data, "prompt"),
                "responses": [texts[item] for item in ranked],
                "ranks": list(ranked.values()),
                "task": data.get("task", "user"),
                "source": source,
            }
        )
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


@dataclass(frozen=True)
class Kind:
    """How one kind of file is imported: `convert` turns a row into rows of `schema` (none
    where it holds no preference) or raises RowError."""

    convert: Callable[[dict[str, Any], str], list[dict[str, Any]]]
    schema: pa.Schema
    nothing: str = "no rows"  # why a file none of whose rows gives a row is refused


IMPORTERS: dict[str, Kind] = {
    "sft": Kind(_sft, SFT_SCHEMA),
    "gsm8k": Kind(_gsm8k, SFT_SCHEMA),
    "qa": Kind(_qa, SFT_SCHEMA),
    "pairwise": Kind(_pairwise, RANKED_SCHEMA),
    "hh": Kind(_hh, RANKED_SCHEMA),
    "ranked": Kind(_ranked, RANKED_SCHEMA),
    "ultrafeedback": Kind(
        _ultrafeedback, RANKED_SCHEMA, "every row's completions share one score; nothing to learn"
    ),
    "label-studio": Kind(_label_studio, RANKED_SCHEMA, "no task has a ranking annotation"),
}


def import_file(path: str | Path, kind: str, skip_bad_rows: bool = False) -> Imported:
    """The rows of a user's file of `kind`, each checked. A bad row is an error naming the
    file, the row and the field, or with `skip_bad_rows` is rejected with its reason; a file
    that gives no row at all is refused either way."""
    path, how = Path(path), IMPORTERS[kind]
    sources = read_records(path)
    rows: list[dict[str, Any]] = []
    rejected: list[Rejected] = []
    for source in sources:
        try:
            converted = how.convert(record_of(source), path.name)
            for row in converted:
                check_fields(row, how.schema)
        except RowError as exc:
            if not skip_bad_rows:
                raise exc.at(path, source.number) from None
            rejected.append(Rejected(source.number, str(exc), source.value))
        else:
            rows += converted
    if rows:
        return Imported(rows, rejected)
    if rejected:
        first = rejected[0]
        raise DataError(
            f"{path}: no row to import: {len(rejected)} of {len(sources)} rejected, the first "
            f"(row {first.row}) because {first.reason}"
        )
    raise DataError(f"{path}: {how.nothing}")


def write_rejected(path: str | Path, rejected: list[Rejected]) -> None:
    """The rejected rows as JSONL, atomically: a `{"row", "reason", "record"}` object a line,
    `record` being the row as it was read (a line's text where it was not JSON)."""
    lines = (
        json.dumps({"row": r.row, "reason": r.reason, "record": r.record}, default=str) + "\n"
        for r in rejected
    )
    write_text(path, "".join(lines))
