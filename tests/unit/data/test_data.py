import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf.data.batching import IGNORE_INDEX, collate
from rlhf.data.rows import MAX_ROW_BYTES
from rlhf.data.schemas import (
    COMPARISON_SCHEMA,
    PREFERENCE_SCHEMA,
    PROMPT_SCHEMA,
    RANKED_SCHEMA,
    SFT_SCHEMA,
    DataError,
    read_rows,
    write_rows,
)
from rlhf.data.splits import split_demonstrations
from rlhf.tokenizer.chat import decode_response, encode_example, prompt_ids
from rlhf.tokenizer.tokenizer import save_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("bytes"), "bytes")


def sft_row(**kw):
    return {
        "prompt": "Greet Bob.", "response": "Hello, Bob!", "reference": None, "task": "greet",
        "source": "t", **kw,
    }  # fmt: skip


def test_every_schema_round_trips(tmp_path):
    meta = {"task": "t", "source": "s"}
    cases = [
        (SFT_SCHEMA, sft_row()),
        (SFT_SCHEMA, sft_row(reference="Hello, Bob!")),
        (PREFERENCE_SCHEMA, {"prompt": "p", "chosen": "a", "rejected": "b", **meta}),
        (RANKED_SCHEMA, {"prompt": "p", "responses": ["a", "b"], "ranks": [0, 1], **meta}),
        (PROMPT_SCHEMA, {"prompt": "p", "reference": "13", **meta}),
    ]
    for i, (schema, row) in enumerate(cases):
        write_rows(tmp_path / f"{i}.parquet", [row, row], schema)
        assert read_rows(tmp_path / f"{i}.parquet", schema) == [row, row]


def write_raw(path, rows, schema=None):
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


@pytest.mark.parametrize(
    ("bad", "field", "problem"),
    [
        ({"response": None}, "response", "is null"),
        ({"response": "   "}, "response", "is empty"),
        ({"prompt": ""}, "prompt", "is empty"),
        ({"task": None}, "task", "is null"),
    ],
)
def test_bad_rows_name_file_row_and_field(tmp_path, bad, field, problem):
    path = write_raw(tmp_path / "d.parquet", [sft_row(), sft_row(), sft_row(**bad)], SFT_SCHEMA)
    with pytest.raises(DataError) as err:
        read_rows(path, SFT_SCHEMA)
    assert str(err.value) == f"{path}: row 3, field '{field}': {problem}"


def test_missing_column_is_named(tmp_path):
    path = write_raw(tmp_path / "d.parquet", [{"prompt": "p", "task": "t", "source": "s"}])
    with pytest.raises(DataError, match=r"d.parquet: field 'response': column missing"):
        read_rows(path, SFT_SCHEMA)


def test_wrong_column_type_is_named(tmp_path):
    rows = [{"prompt": "p", "response": 3, "task": "t", "source": "s"}]
    path = write_raw(tmp_path / "d.parquet", rows)
    with pytest.raises(
        DataError, match=r"field 'response': column has type int64, expected string"
    ):
        read_rows(path, SFT_SCHEMA)


def test_wrong_python_type_in_rows_is_named(tmp_path):
    with pytest.raises(DataError, match=r"row 2, field 'prompt': expected text, got 5"):
        write_rows(tmp_path / "x.parquet", [sft_row(), sft_row(prompt=5)], SFT_SCHEMA)
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.parametrize(
    ("responses", "ranks", "field", "problem"),
    [
        (["a", "b", "c"], [0, 1], "ranks", "has 2 ranks for 3 responses"),
        (["a"], [0], "responses", "needs at least 2 responses"),
        (["a", ""], [0, 1], "responses", "item 1 is empty"),
        (["a", "b"], [0, -1], "ranks", "expected non-negative integers"),
    ],
)
def test_rank_lists_must_match_responses(tmp_path, responses, ranks, field, problem):
    good = {"prompt": "p", "responses": ["x", "y"], "ranks": [1, 0], "task": "t", "source": "s"}
    bad = {**good, "responses": responses, "ranks": ranks}
    path = write_raw(tmp_path / "r.parquet", [good, bad], RANKED_SCHEMA)
    with pytest.raises(DataError, match=rf"r.parquet: row 2, field '{field}': {problem}"):
        read_rows(path, RANKED_SCHEMA)


def test_a_collected_sample_may_be_empty_an_imported_answer_not(tmp_path):
    row = {"prompt": "p", "responses": ["x", ""], "ranks": [0, 1], "task": "t", "source": "s"}
    collected = {**row, "gold_scores": [1.0, 0.0]}
    path = write_raw(tmp_path / "c.parquet", [collected], COMPARISON_SCHEMA)
    assert read_rows(path, COMPARISON_SCHEMA)[0]["responses"] == ["x", ""]
    path = write_raw(tmp_path / "r.parquet", [row], RANKED_SCHEMA)
    with pytest.raises(DataError, match="item 1 is empty"):
        read_rows(path, RANKED_SCHEMA)


def test_every_reader_and_writer_holds_rows_to_the_size_limit(tmp_path):
    """The one row rule: a giant row is refused by read_rows (prepare on data/raw/, every
    stage's inputs) as by the importers, naming the file, the row and the biggest field."""
    rows = [sft_row(), sft_row(response="y" * MAX_ROW_BYTES)]
    path = write_raw(tmp_path / "d.parquet", rows, SFT_SCHEMA)
    with pytest.raises(DataError) as err:
        read_rows(path, SFT_SCHEMA)
    assert re.fullmatch(
        rf"{path}: row 2, field 'response': the row is 1,000,\d\d\d bytes, over the limit of "
        r"1,000,000 bytes per row; split or shorten it",
        str(err.value),
    )
    with pytest.raises(DataError, match=r"x.parquet: row 2, field 'response': the row is"):
        write_rows(tmp_path / "x.parquet", rows, SFT_SCHEMA)
    assert not (tmp_path / "x.parquet").exists()


def test_a_bad_value_is_quoted_short(tmp_path):
    path = tmp_path / "x.parquet"
    with pytest.raises(DataError) as err:
        write_rows(path, [sft_row(), sft_row(prompt=["z" * 500])], SFT_SCHEMA)
    assert str(err.value) == f"{path}: row 2, field 'prompt': expected text, got ['{'z' * 55}..."


def test_unreadable_file_is_a_data_error(tmp_path):
    path = tmp_path / "junk.parquet"
    path.write_text("not parquet")
    with pytest.raises(DataError, match=r"junk\.parquet: not a readable Parquet file"):
        read_rows(path, SFT_SCHEMA)


def test_collate_masks_loss_to_response_and_end_token(tok):
    examples = [encode_example(tok, "ab", "xyz", 64), encode_example(tok, "abcdef", "q", 64)]
    inputs, targets = collate(examples, tok.pad_id)
    assert inputs.shape == targets.shape == (2, 9)  # longest ids: 1 + 6 + 1 + 1 + 1, minus 1
    supervised = [[t for t in row if t != IGNORE_INDEX] for row in targets.tolist()]
    assert supervised[0] == [*b"xyz", tok.eos_id]
    assert supervised[1] == [*b"q", tok.eos_id]
    assert inputs[0].tolist()[:7] == [*tok.prefix, *b"ab", *tok.infix, *b"xyz"]
    assert inputs[0].tolist()[7:] == [tok.pad_id] * 2  # right padding, no loss on it
    # each target is the input shifted by one
    row = examples[0].ids
    assert targets[0, examples[0].response_start - 1].item() == row[examples[0].response_start]


@pytest.mark.parametrize(("prompt_len", "response_len"), [(100, 5), (5, 100), (100, 100), (3, 3)])
def test_truncation_keeps_end_token_and_response(tok, prompt_len, response_len):
    block = 32
    example = encode_example(tok, "p" * prompt_len + "?", "r" * response_len, block)
    assert len(example.ids) <= block
    assert example.ids[-1] == tok.eos_id
    response = example.ids[example.response_start : -1]
    assert len(response) >= min(response_len, (block - 3) // 2)
    assert example.ids[example.response_start - 1] == tok.infix[-1]
    if prompt_len > block:  # the prompt keeps its end, where the question is
        assert example.ids[example.response_start - 2] == ord("?")


def test_the_chat_template_frames_training_and_generation_alike(tok):
    """A sequence trained on starts with exactly the context a policy later answers from."""
    example = encode_example(tok, "What is 2 plus 3?", "5.", 64)
    context = prompt_ids(tok, "What is 2 plus 3?")
    assert example.ids[: example.response_start] == context
    assert decode_response(tok, example.ids[example.response_start :]) == "5."
    assert decode_response(tok, [*b"ok", tok.pad_id, *b"junk"]) == "ok"


def test_a_file_written_before_references_reads_as_having_none(tmp_path):
    """data/raw/sft.parquet imported by an earlier version has no reference column."""
    path = tmp_path / "old.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "p", "task": "t", "source": "s"}]), path)
    assert read_rows(path, PROMPT_SCHEMA) == [
        {"prompt": "p", "reference": None, "task": "t", "source": "s"}
    ]


def test_one_prompt_with_two_references_is_refused_naming_both_rows():
    rows = [sft_row(prompt=f"Q{i}.", reference="1") for i in range(40)]
    rows.append(sft_row(prompt="Q3.", reference="2"))
    with pytest.raises(DataError, match=r"raw.parquet: rows 4 and 41 give the prompt 'Q3.' "
                       r"different references \('1' and '2'\); keep one"):  # fmt: skip
        split_demonstrations(rows, 0.05, 0.05, seed=0, source="raw.parquet")


def test_references_follow_their_prompts_into_every_split():
    rows = [sft_row(prompt=f"Q{i}.", reference=str(i) if i % 2 else None) for i in range(80)]
    sets = split_demonstrations(rows, 0.1, 0.1, seed=0, source="raw.parquet")
    for name, found in sets.items():
        assert found, name
        for row in found:
            number = int(row["prompt"][1:-1])
            assert row["reference"] == (str(number) if number % 2 else None), name
