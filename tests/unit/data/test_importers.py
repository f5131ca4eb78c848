import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf.data.importers import import_file, read_prompts, split_transcript
from rlhf.data.rows import MAX_ROW_BYTES
from rlhf.data.schemas import DataError


def jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def imported(kind, path):
    return import_file(path, kind).rows


HH = [
    {
        "chosen": "\n\nHuman: How do I bake bread?\n\nAssistant: Mix flour, water, yeast."
        "\n\nHuman: And then?\n\nAssistant: Knead it and let it rise.",
        "rejected": "\n\nHuman: How do I bake bread?\n\nAssistant: Mix flour, water, yeast."
        "\n\nHuman: And then?\n\nAssistant: I don't know.",
    },
    {
        "chosen": "\n\nHuman: Say hi.\n\nAssistant: Hi!",
        "rejected": "\n\nHuman: Say hi.\n\nAssistant: No.",
    },
]


def test_hh_rlhf_transcripts_split_into_shared_prompt_and_final_answers(tmp_path):
    rows = imported("hh", jsonl(tmp_path / "hh.jsonl", HH))
    assert len(rows) == 2
    first = rows[0]
    assert first["prompt"] == (
        "Human: How do I bake bread?\n\nAssistant: Mix flour, water, yeast.\n\nHuman: And then?"
    )
    assert first["responses"] == ["Knead it and let it rise.", "I don't know."]
    assert first["ranks"] == [0, 1]
    assert first["source"] == "hh.jsonl"


def test_hh_row_with_different_dialogues_is_named(tmp_path):
    bad = dict(HH[1], rejected="\n\nHuman: Say bye.\n\nAssistant: Bye.")
    with pytest.raises(DataError, match=r"hh.jsonl: row 2, field 'rejected': its dialogue"):
        imported("hh", jsonl(tmp_path / "hh.jsonl", [HH[0], bad]))


def test_hh_row_without_assistant_turn_is_named(tmp_path):
    bad = {"chosen": "\n\nHuman: hi", "rejected": "\n\nHuman: hi\n\nAssistant: x"}
    with pytest.raises(DataError, match=r"row 1, field 'chosen': has no"):
        imported("hh", jsonl(tmp_path / "hh.jsonl", [bad]))
    with pytest.raises(ValueError):
        split_transcript("no turns at all")


def test_pairwise_rows(tmp_path):
    rows = imported(
        "pairwise",
        jsonl(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": "good", "rejected": "bad"}]),
    )
    assert rows[0]["responses"] == ["good", "bad"] and rows[0]["ranks"] == [0, 1]
    with pytest.raises(DataError, match=r"p2.jsonl: row 2, field 'rejected': is empty"):
        imported(
            "pairwise",
            jsonl(
                tmp_path / "p2.jsonl",
                [
                    {"prompt": "q", "chosen": "a", "rejected": "b"},
                    {"prompt": "q", "chosen": "a", "rejected": " "},
                ],
            ),
        )


def test_ranked_rows(tmp_path):
    record = {"prompt": "q", "responses": [{"text": "a", "rank": 1}, {"text": "b", "rank": 0}]}
    rows = imported("ranked", jsonl(tmp_path / "r.jsonl", [record]))
    assert rows[0]["responses"] == ["a", "b"] and rows[0]["ranks"] == [1, 0]
    with pytest.raises(DataError, match=r"row 1, field 'responses\[1\]': has no 'rank'"):
        imported("ranked", jsonl(tmp_path / "r2.jsonl", [{"prompt": "q", "responses": [
            {"text": "a", "rank": 0}, {"text": "b"}]}]))  # fmt: skip
    tied = {"prompt": "q", "responses": [{"text": "a", "rank": 0}, {"text": "b", "rank": 0}]}
    with pytest.raises(DataError, match=r"row 1, field 'ranks': all responses share one rank"):
        imported("ranked", jsonl(tmp_path / "r3.jsonl", [tied]))
    null = {"prompt": None, "responses": record["responses"]}
    with pytest.raises(DataError, match=r"row 1, field 'prompt': is null"):
        imported("ranked", jsonl(tmp_path / "r4.jsonl", [null]))


def test_ranked_accepts_the_pipelines_own_flat_shape(tmp_path):
    """`responses: [str]` beside `ranks: [int]`, as data/raw/comparisons.parquet holds them."""
    flat = {"prompt": "q", "responses": ["a", "b", "c"], "ranks": [1, 0, 1], "task": "t"}
    for path in (tmp_path / "flat.jsonl", tmp_path / "flat.parquet"):
        if path.suffix == ".parquet":
            pq.write_table(pa.Table.from_pylist([flat]), path)
        else:
            jsonl(path, [flat])
        [row] = imported("ranked", path)
        assert row == {**flat, "source": path.name}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ranks": [0, 0, 0]}, r"field 'ranks': all responses share one rank"),
        ({"ranks": [0, 1]}, r"field 'ranks': has 2 ranks for 3 responses"),
        ({"responses": ["a"], "ranks": [0]}, r"field 'responses': needs at least 2 responses"),
        ({"responses": ["a", "a "], "ranks": [0, 1]}, r"field 'responses': the same text appears"),
        ({"ranks": [0, 1.5, 2]}, r"field 'ranks': expected non-negative integers"),
        ({"responses": ["a", 7, "c"]}, r"field 'responses': item 1 is empty or not text"),
        ({"ranks": None}, r"field 'ranks': is null"),
    ],
)
def test_flat_ranked_rows_name_their_defect(tmp_path, change, message):
    flat = {"prompt": "q", "responses": ["a", "b", "c"], "ranks": [2, 0, 1], **change}
    path = jsonl(
        tmp_path / "r.jsonl", [{"prompt": "q", "responses": ["x", "y"], "ranks": [0, 1]}, flat]
    )
    with pytest.raises(DataError, match=rf"r.jsonl: row 2, {message}"):
        imported("ranked", path)


@pytest.mark.parametrize(
    ("kind", "record", "field"),
    [
        ("sft", {"prompt": "a"}, "response"),
        ("pairwise", {"prompt": "q", "chosen": "a"}, "rejected"),
        ("hh", {"chosen": HH[1]["chosen"]}, "rejected"),
        ("ranked", {"prompt": "q", "responses": ["a", "b"]}, "ranks"),
        ("ranked", {"responses": ["a", "b"], "ranks": [0, 1]}, "prompt"),
        ("ultrafeedback", {"prompt": "q"}, "completions"),
    ],
)
def test_a_missing_field_is_missing_not_null(tmp_path, kind, record, field):
    for path in (tmp_path / "m.jsonl", tmp_path / "m.parquet"):
        if path.suffix == ".parquet":
            pq.write_table(pa.Table.from_pylist([record]), path)
        else:
            jsonl(path, [record])
        with pytest.raises(DataError) as err:
            imported(kind, path)
        assert str(err.value) == f"{path}: row 1, field '{field}': missing"


def test_invalid_utf8_names_the_line_and_byte_offset(tmp_path):
    path = tmp_path / "d.jsonl"
    first = json.dumps({"prompt": "a", "response": "b"}).encode() + b"\n"
    path.write_bytes(first + b'{"prompt": "caf\xe9", "response": "x"}\n')
    with pytest.raises(DataError) as err:
        imported("sft", path)
    offset = len(first) + len(b'{"prompt": "caf')
    assert str(err.value).startswith(f"{path}: line 2: invalid UTF-8 at byte offset {offset}")


def test_a_row_over_the_size_limit_is_rejected_not_truncated(tmp_path):
    big = "x" * (MAX_ROW_BYTES + 1)
    for path in (tmp_path / "big.jsonl", tmp_path / "big.parquet"):
        rows = [{"prompt": "a", "response": "b"}, {"prompt": "a", "response": big}]
        if path.suffix == ".parquet":
            pq.write_table(pa.Table.from_pylist(rows), path)
        else:
            jsonl(path, rows)
        with pytest.raises(DataError) as err:
            imported("sft", path)
        assert re.fullmatch(
            rf"{path}: row 2, field 'response': the row is 1,000,0\d\d bytes, over the limit of "
            r"1,000,000 bytes per row; split or shorten it",
            str(err.value),
        )


def test_jsonl_rows_are_numbered_by_their_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "response": "b"}\n\n{"prompt": "c", "response": ""}\n')
    with pytest.raises(DataError, match=r"d.jsonl: row 3, field 'response': is empty"):
        imported("sft", path)


def test_a_prompts_file_meets_the_row_rule(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("Greet Ann.\n\n  \nSay hi.\n")
    assert read_prompts(path) == ["Greet Ann.", "Say hi."]
    path.write_text("Greet Ann.\n" + "x" * (MAX_ROW_BYTES + 1) + "\n")
    with pytest.raises(DataError, match=r"prompts.txt: row 2, field 'prompt': the row is 1,000,0"):
        read_prompts(path)
    path.write_text("\n \n")
    with pytest.raises(DataError, match=r"prompts.txt: holds no prompts"):
        read_prompts(path)


def test_hh_transcript_ending_with_a_human_turn_is_named(tmp_path):
    bad = {
        "chosen": "\n\nHuman: Say hi.\n\nAssistant: Hi!\n\nHuman: Thanks.",
        "rejected": "\n\nHuman: Say hi.\n\nAssistant: No.",
    }
    with pytest.raises(DataError, match=r"row 2, field 'chosen': ends with a Human turn"):
        imported("hh", jsonl(tmp_path / "hh.jsonl", [HH[1], bad]))


def test_identical_answers_are_rejected_with_their_row(tmp_path):
    same = {"prompt": "q", "chosen": "same answer", "rejected": "same answer "}
    with pytest.raises(DataError, match=r"row 1, field 'rejected': the same text as 'chosen'"):
        imported("pairwise", jsonl(tmp_path / "p.jsonl", [same]))
    hh = {"chosen": "\n\nHuman: hi\n\nAssistant: yo", "rejected": "\n\nHuman: hi\n\nAssistant: yo"}
    with pytest.raises(DataError, match=r"row 1, field 'rejected': the same text"):
        imported("hh", jsonl(tmp_path / "hh.jsonl", [hh]))
    ranked = {"prompt": "q", "responses": [{"text": "a", "rank": 0}, {"text": "a", "rank": 1}]}
    with pytest.raises(DataError, match=r"row 1, field 'responses': the same text appears twice"):
        imported("ranked", jsonl(tmp_path / "r.jsonl", [ranked]))


ULTRAFEEDBACK = {
    "instruction": "Name a prime.",
    "completions": [
        {"response": "4", "overall_score": 2.0},
        {"response": "7", "overall_score": 9.5},
        {"response": "It is 2.", "overall_score": 9.5},
        {"response": "7", "overall_score": 9.5},  # a repeat, counted once
    ],
}


def test_ultrafeedback_scores_become_ranks_with_ties(tmp_path):
    tied = {"prompt": "q", "completions": [{"text": "a", "score": 1}, {"text": "b", "score": 1}]}
    rows = imported("ultrafeedback", jsonl(tmp_path / "u.jsonl", [ULTRAFEEDBACK, tied]))
    assert len(rows) == 1  # the all-tied row holds no preference
    assert rows[0]["prompt"] == "Name a prime." and rows[0]["responses"] == ["4", "7", "It is 2."]
    assert rows[0]["ranks"] == [1, 0, 0] and rows[0]["source"] == "u.jsonl"


def test_ultrafeedback_completions_equal_but_for_spaces_are_one_answer(tmp_path):
    """The row rule calls them the same text: the repeat is dropped, not the row refused."""
    completions = [
        {"text": "7", "score": 9},
        {"text": " 7\n", "score": 9},
        {"text": "4", "score": 1},
    ]
    (row,) = imported(
        "ultrafeedback", jsonl(tmp_path / "u.jsonl", [{"prompt": "q", "completions": completions}])
    )
    assert row["responses"] == ["7", "4"] and row["ranks"] == [0, 1]


@pytest.mark.parametrize(
    ("completions", "message"),
    [
        ("7", r"row 2, field 'completions': expected a list of"),
        ([{"response": "7"}], r"row 2, field 'completions\[0\]': no number in 'overall_score'"),
        ([{"response": " ", "score": 1}], r"row 2, field 'completions\[0\]': no text"),
        ([{"response": "a", "score": True}], r"row 2, field 'completions\[0\]': no number"),
        (
            [{"response": "a", "score": 1}, {"response": "b", "score": 2},
             {"response": "a", "score": 3}],
            r"row 2, field 'completions\[2\]': the same text as an earlier completion",
        ),
        (
            [{"response": "a", "overall_score": float("nan")}, {"response": "b", "score": 2}],
            r"row 2, field 'completions\[0\]': 'overall_score' is NaN, not a score",
        ),
    ],
)  # fmt: skip
def test_ultrafeedback_errors_name_the_row_and_completion(tmp_path, completions, message):
    path = jsonl(tmp_path / "u.jsonl", [ULTRAFEEDBACK, {"prompt": "q", "completions": completions}])
    with pytest.raises(DataError, match=message):
        imported("ultrafeedback", path)
    no_prompt = {"completions": ULTRAFEEDBACK["completions"]}
    with pytest.raises(DataError, match=r"row 1, field 'prompt': missing"):
        imported("ultrafeedback", jsonl(tmp_path / "p.jsonl", [no_prompt]))


def test_skip_bad_rows_keeps_the_good_rows_and_each_bad_one_with_its_reason(tmp_path):
    """One bad row of a real HH-RLHF file no longer stops the import, when asked."""
    same = {"chosen": HH[1]["chosen"], "rejected": HH[1]["chosen"]}
    mismatched = dict(HH[1], rejected="\n\nHuman: Say bye.\n\nAssistant: Bye.")
    human_last = dict(HH[1], chosen=HH[1]["chosen"] + "\n\nHuman: Thanks.")
    path = jsonl(tmp_path / "hh.jsonl", [HH[0], same, mismatched, HH[1], human_last])
    with path.open("a") as handle:
        handle.write("{oops\n")
    with pytest.raises(DataError, match=r"hh.jsonl: row 2, field 'rejected': the same text"):
        import_file(path, "hh")
    result = import_file(path, "hh", skip_bad_rows=True)
    assert [row["responses"][0] for row in result.rows] == ["Knead it and let it rise.", "Hi!"]
    assert [(r.row, r.record) for r in result.rejected] == [
        (2, same), (3, mismatched), (5, human_last), (6, "{oops")
    ]  # fmt: skip
    reasons = [r.reason for r in result.rejected]
    assert reasons[0].startswith("field 'rejected': the same text as 'chosen'")
    assert reasons[1].startswith("field 'rejected': its dialogue before the final answer")
    assert reasons[2].startswith("field 'chosen': ends with a Human turn")
    assert reasons[3].startswith("not valid JSON (")


def test_skip_bad_rows_still_refuses_a_file_with_no_good_row(tmp_path):
    path = jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}, {"prompt": "b", "response": " "}])
    with pytest.raises(DataError) as err:
        import_file(path, "sft", skip_bad_rows=True)
    assert str(err.value) == (
        f"{path}: no row to import: 2 of 2 rejected, the first (row 1) because field "
        "'response': missing"
    )


def label_studio_task(annotations: list[dict]) -> dict:
    items = [{"id": "a", "title": "A", "body": "Paris."}, {"id": "b", "body": "Lyon."},
             {"id": "c", "body": "I don't know."}]  # fmt: skip
    return {"id": 7, "data": {"prompt": "Capital of France?", "items": items},
            "annotations": annotations}  # fmt: skip


def ranker(value: dict, cancelled: bool = False) -> dict:
    result = [{"type": "ranker", "from_name": "rank", "to_name": "items", "value": value}]
    return {"result": result, "was_cancelled": cancelled, "completed_by": 1}


def test_label_studio_rankings_and_buckets_become_ranked_rows(tmp_path):
    export = [
        label_studio_task([
            ranker({"ranker": {"rank": ["a", "c", "b"]}}),  # an order
            ranker({"ranker": {"good": ["a", "b"], "bad": ["c"], "_": []}}),  # tied buckets
            ranker({"ranker": {"rank": ["c", "a", "b"]}}, cancelled=True),
        ]),
        label_studio_task([]),  # not labeled yet
    ]  # fmt: skip
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export, indent=2))
    order, buckets = imported("label-studio", path)
    assert order["prompt"] == "Capital of France?" and order["source"] == "export.json"
    assert order["responses"] == ["Paris.", "I don't know.", "Lyon."]
    assert order["ranks"] == [0, 1, 2]
    assert buckets["responses"] == ["Paris.", "Lyon.", "I don't know."]
    assert buckets["ranks"] == [0, 0, 1]


def test_label_studio_errors_name_the_task_and_annotation(tmp_path):
    path = tmp_path / "export.json"
    cases = [
        ([{"id": 1}], r"row 1, field 'data': missing; is this a Label Studio JSON export"),
        ([{"data": {"prompt": "q", "items": ["a"]}}], r"row 1, field 'data': no list of"),
        (
            [label_studio_task([{"result": [{"type": "choices", "value": {}}]}])],
            r"row 1, field 'annotations\[0\].result': no ranker result",
        ),
        (
            [label_studio_task([ranker({"ranker": {"rank": ["a", "z"]}})])],
            r"row 1, field 'annotations\[0\].result': ids \['z'\] are not among",
        ),
        ([label_studio_task([])], r"export.json: no task has a ranking annotation"),
    ]
    for export, message in cases:
        path.write_text(json.dumps(export))
        with pytest.raises(DataError, match=message):
            imported("label-studio", path)
    path.write_text("[{oops")
    with pytest.raises(DataError, match=r"export.json: not valid JSON"):
        imported("label-studio", path)


def test_every_importer_is_a_choice_of_rlhf_import_and_nothing_else():
    """The CLI's formats come from `import_formats.FORMATS` (light, read at startup); a format
    registered in one place and not the other would be unreachable or fail."""
    from rlhf.cli.data import ImportKind
    from rlhf.data.import_formats import FORMATS
    from rlhf.data.importers import IMPORTERS

    assert list(FORMATS) == list(IMPORTERS)
    assert [kind.value for kind in ImportKind] == list(IMPORTERS)


def test_gsm8k_rows_become_demonstrations_with_their_final_answer_as_reference(tmp_path):
    rows = imported(
        "gsm8k",
        jsonl(
            tmp_path / "gsm8k.jsonl",
            [
                {
                    "question": "Ann has 3 boxes of 4 pens. How many pens?",
                    "answer": "3 boxes hold 3*4=<<3*4=12>>12 pens.\n#### 12",
                },
                {"question": "Pay $1,200 twice?", "answer": "2*1200=2400\n#### 2,400"},
            ],
        ),
    )
    assert rows[0] == {
        "prompt": "Ann has 3 boxes of 4 pens. How many pens?",
        "response": "3 boxes hold 3*4=12 pens.\n#### 12",  # the calculator notes removed
        "reference": "12",
        "task": "gsm8k",
        "source": "gsm8k.jsonl",
    }
    assert rows[1]["reference"] == "2,400"  # as written: the checker compares numbers


def test_qa_rows_answer_is_demonstration_and_reference(tmp_path):
    path = jsonl(tmp_path / "qa.jsonl", [{"question": "Capital of Peru?", "answer": "Lima"}])
    assert imported("qa", path) == [
        {
            "prompt": "Capital of Peru?",
            "response": "Lima",
            "reference": "Lima",
            "task": "qa",
            "source": "qa.jsonl",
        }
    ]


@pytest.mark.parametrize(
    ("kind", "record", "message"),
    [
        ("gsm8k", {"question": "q", "answer": "It is 12."}, "field 'answer': has no final answer "
         "after '####'"),
        ("gsm8k", {"question": "q", "answer": "12\n####   "}, "field 'answer': has no final"),
        ("gsm8k", {"answer": "#### 1"}, "field 'question': missing"),
        ("gsm8k", {"question": "q", "answer": 12}, "field 'answer': expected text, got 12"),
        ("qa", {"answer": "Lima"}, "field 'prompt': missing"),
        ("qa", {"prompt": "q", "answer": "  "}, "field 'answer': is empty"),
        ("sft", {"prompt": "q", "response": "a", "reference": " "}, "field 'reference': is empty"),
        ("sft", {"prompt": "q", "response": "a", "reference": 7}, "field 'reference': expected "
         "text, got 7"),
    ],
)  # fmt: skip
def test_malformed_question_answer_rows_are_refused_in_one_line(tmp_path, kind, record, message):
    good = {"prompt": "ok", "question": "ok", "response": "a", "answer": "#### 1"}  # every kind's
    with pytest.raises(DataError) as err:
        imported(kind, jsonl(tmp_path / "bad.jsonl", [good, record]))
    assert str(err.value).startswith(f"{tmp_path / 'bad.jsonl'}: row 2, {message}")
    assert "\n" not in str(err.value)


def test_an_sft_row_may_carry_a_reference_or_none(tmp_path):
    rows = imported(
        "sft",
        jsonl(
            tmp_path / "sft.jsonl",
            [{"prompt": "q", "response": "a"}, {"prompt": "r", "response": "b", "reference": "b"}],
        ),
    )
    assert [r.get("reference") for r in rows] == [None, "b"]
