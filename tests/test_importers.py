import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf.data.importers import (
    MAX_ROW_BYTES,
    import_hh,
    import_label_studio,
    import_pairwise,
    import_ranked,
    import_sft,
    import_ultrafeedback,
    split_transcript,
)
from rlhf.data.schemas import DataError


def jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


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
    rows = import_hh(jsonl(tmp_path / "hh.jsonl", HH))
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
    with pytest.raises(DataError, match=r"hh.jsonl: row 1, field 'rejected': its dialogue"):
        import_hh(jsonl(tmp_path / "hh.jsonl", [HH[0], bad]))


def test_hh_row_without_assistant_turn_is_named(tmp_path):
    bad = {"chosen": "\n\nHuman: hi", "rejected": "\n\nHuman: hi\n\nAssistant: x"}
    with pytest.raises(DataError, match=r"row 0, field 'chosen': has no"):
        import_hh(jsonl(tmp_path / "hh.jsonl", [bad]))
    with pytest.raises(ValueError):
        split_transcript("no turns at all")


def test_pairwise_rows(tmp_path):
    rows = import_pairwise(
        jsonl(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": "good", "rejected": "bad"}])
    )
    assert rows[0]["responses"] == ["good", "bad"] and rows[0]["ranks"] == [0, 1]
    with pytest.raises(DataError, match=r"p2.jsonl: row 1, field 'rejected': is empty"):
        import_pairwise(
            jsonl(
                tmp_path / "p2.jsonl",
                [
                    {"prompt": "q", "chosen": "a", "rejected": "b"},
                    {"prompt": "q", "chosen": "a", "rejected": " "},
                ],
            )
        )


def test_ranked_rows(tmp_path):
    record = {"prompt": "q", "responses": [{"text": "a", "rank": 1}, {"text": "b", "rank": 0}]}
    rows = import_ranked(jsonl(tmp_path / "r.jsonl", [record]))
    assert rows[0]["responses"] == ["a", "b"] and rows[0]["ranks"] == [1, 0]
    with pytest.raises(DataError, match=r"row 0, field 'responses': expected a list of"):
        import_ranked(jsonl(tmp_path / "r2.jsonl", [{"prompt": "q", "responses": ["a", "b"]}]))
    tied = {"prompt": "q", "responses": [{"text": "a", "rank": 0}, {"text": "b", "rank": 0}]}
    with pytest.raises(DataError, match=r"row 0, field 'ranks': all responses share one rank"):
        import_ranked(jsonl(tmp_path / "r3.jsonl", [tied]))
    missing = {"prompt": None, "responses": record["responses"]}
    with pytest.raises(DataError, match=r"row 0, field 'prompt': is null"):
        import_ranked(jsonl(tmp_path / "r4.jsonl", [missing]))


def test_invalid_utf8_names_the_line_and_byte_offset(tmp_path):
    path = tmp_path / "d.jsonl"
    first = json.dumps({"prompt": "a", "response": "b"}).encode() + b"\n"
    path.write_bytes(first + b'{"prompt": "caf\xe9", "response": "x"}\n')
    with pytest.raises(DataError) as err:
        import_sft(path)
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
        with pytest.raises(DataError, match=r"row 1: 1,000,0\d\d bytes, over the limit of 1,000,"):
            import_sft(path)


def test_hh_transcript_ending_with_a_human_turn_is_named(tmp_path):
    bad = {
        "chosen": "\n\nHuman: Say hi.\n\nAssistant: Hi!\n\nHuman: Thanks.",
        "rejected": "\n\nHuman: Say hi.\n\nAssistant: No.",
    }
    with pytest.raises(DataError, match=r"row 1, field 'chosen': ends with a Human turn"):
        import_hh(jsonl(tmp_path / "hh.jsonl", [HH[1], bad]))


def test_identical_answers_are_rejected_with_their_row(tmp_path):
    same = {"prompt": "q", "chosen": "same answer", "rejected": "same answer "}
    with pytest.raises(DataError, match=r"row 0, field 'rejected': the same text as 'chosen'"):
        import_pairwise(jsonl(tmp_path / "p.jsonl", [same]))
    hh = {"chosen": "\n\nHuman: hi\n\nAssistant: yo", "rejected": "\n\nHuman: hi\n\nAssistant: yo"}
    with pytest.raises(DataError, match=r"row 0, field 'rejected': the same text"):
        import_hh(jsonl(tmp_path / "hh.jsonl", [hh]))
    ranked = {"prompt": "q", "responses": [{"text": "a", "rank": 0}, {"text": "a", "rank": 1}]}
    with pytest.raises(DataError, match=r"row 0, field 'responses': the same text appears twice"):
        import_ranked(jsonl(tmp_path / "r.jsonl", [ranked]))


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
    rows = import_ultrafeedback(jsonl(tmp_path / "u.jsonl", [ULTRAFEEDBACK, tied]))
    assert len(rows) == 1  # the all-tied row holds no preference
    assert rows[0]["prompt"] == "Name a prime." and rows[0]["responses"] == ["4", "7", "It is 2."]
    assert rows[0]["ranks"] == [1, 0, 0] and rows[0]["source"] == "u.jsonl"


@pytest.mark.parametrize(
    ("completions", "message"),
    [
        ("7", r"row 1, field 'completions': expected a list of"),
        ([{"response": "7"}], r"row 1, field 'completions\[0\]': no number in 'overall_score'"),
        ([{"response": " ", "score": 1}], r"row 1, field 'completions\[0\]': no text"),
        ([{"response": "a", "score": True}], r"row 1, field 'completions\[0\]': no number"),
        (
            [{"response": "a", "score": 1}, {"response": "b", "score": 2},
             {"response": "a", "score": 3}],
            r"row 1, field 'completions\[2\]': the same text as an earlier completion",
        ),
    ],
)  # fmt: skip
def test_ultrafeedback_errors_name_the_row_and_completion(tmp_path, completions, message):
    path = jsonl(tmp_path / "u.jsonl", [ULTRAFEEDBACK, {"prompt": "q", "completions": completions}])
    with pytest.raises(DataError, match=message):
        import_ultrafeedback(path)
    no_prompt = {"completions": ULTRAFEEDBACK["completions"]}
    with pytest.raises(DataError, match=r"row 0, field 'prompt': is null"):
        import_ultrafeedback(jsonl(tmp_path / "p.jsonl", [no_prompt]))


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
    order, buckets = import_label_studio(path)
    assert order["prompt"] == "Capital of France?" and order["source"] == "export.json"
    assert order["responses"] == ["Paris.", "I don't know.", "Lyon."]
    assert order["ranks"] == [0, 1, 2]
    assert buckets["responses"] == ["Paris.", "Lyon.", "I don't know."]
    assert buckets["ranks"] == [0, 0, 1]


def test_label_studio_errors_name_the_task_and_annotation(tmp_path):
    path = tmp_path / "export.json"
    cases = [
        ([{"id": 1}], r"row 0, field 'data': missing; is this a Label Studio JSON export"),
        ([{"data": {"prompt": "q", "items": ["a"]}}], r"row 0, field 'data': no list of"),
        (
            [label_studio_task([{"result": [{"type": "choices", "value": {}}]}])],
            r"row 0, field 'annotations\[0\].result': no ranker result",
        ),
        (
            [label_studio_task([ranker({"ranker": {"rank": ["a", "z"]}})])],
            r"row 0, field 'annotations\[0\].result': ids \['z'\] are not among",
        ),
        ([label_studio_task([])], r"export.json: no task has a ranking annotation"),
    ]
    for export, message in cases:
        path.write_text(json.dumps(export))
        with pytest.raises(DataError, match=message):
            import_label_studio(path)
    path.write_text("[{oops")
    with pytest.raises(DataError, match=r"export.json: not valid JSON"):
        import_label_studio(path)
