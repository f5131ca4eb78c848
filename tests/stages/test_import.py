import json
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rlhf.cli import app
from rlhf.data.importers import import_file
from rlhf.data.rows import MAX_ROW_BYTES
from rlhf.data.schemas import PROMPT_SCHEMA, RANKED_SCHEMA, SFT_SCHEMA, DataError, read_rows

from conftest import clean_env, make_project, run_module, write_params


def write_jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_import_validates_each_row(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "a", "response": "b"}, {"prompt": "c", "response": ""}]
    )
    with pytest.raises(DataError, match=r"d.jsonl: row 2, field 'response': is empty"):
        import_file(path, "sft")
    path = write_jsonl(tmp_path / "e.jsonl", [{"prompt": "a"}])
    with pytest.raises(DataError, match=r"e.jsonl: row 1, field 'response': missing"):
        import_file(path, "sft")
    path = write_jsonl(tmp_path / "n.jsonl", [{"prompt": "a", "response": None}])
    with pytest.raises(DataError, match=r"n.jsonl: row 1, field 'response': is null"):
        import_file(path, "sft")
    (tmp_path / "f.jsonl").write_text('{"prompt": "a", "response": "b"}\n{oops\n')
    with pytest.raises(DataError, match=r"f.jsonl: row 2: not valid JSON"):
        import_file(tmp_path / "f.jsonl", "sft")


def test_cli_import_reports_errors_and_writes_nothing(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "response": None}])
    result = CliRunner().invoke(app, ["import", str(bad), "--out", str(tmp_path / "o.parquet")])
    assert result.exit_code == 2
    assert "row 1, field 'response'" in result.output
    assert not (tmp_path / "o.parquet").exists()


def test_files_source_runs_prepare_on_imported_data(tmp_path):
    project = make_project(tmp_path / "p")
    params = {"data.source": "files", "data.heldout_fraction": 0.1, "collect.labeler": "human"}
    write_params(project, params)
    records = [
        {"prompt": f"Question {i}?", "response": f"Answer {i}.", "task": "qa"} for i in range(40)
    ] + [{"prompt": "Question 0?", "response": "Another answer."}]
    source = write_jsonl(tmp_path / "mine.jsonl", records)
    out = project / "data" / "raw" / "sft.parquet"
    result = CliRunner().invoke(app, ["import", str(source), "--out", str(out)])
    assert result.exit_code == 0, result.output
    prepared_log = run_module("rlhf.stages.prepare", project).stderr
    assert "warning: only 19 held-out prompts (fewer than 32)" in prepared_log
    prepared = project / "data" / "prepared"
    train = read_rows(prepared / "sft_train.parquet", SFT_SCHEMA)
    val = read_rows(prepared / "sft_val.parquet", SFT_SCHEMA)
    heldout = read_rows(prepared / "prompts_heldout.parquet", PROMPT_SCHEMA)
    held = {r["prompt"] for r in heldout}
    train_prompts, val_prompts = {r["prompt"] for r in train}, {r["prompt"] for r in val}
    # 10% of 40 prompts is 4: raised to half of what validation leaves (19), short of 32
    assert len(held) == 19 and len(val_prompts) == 2
    assert not held & (train_prompts | val_prompts) and not train_prompts & val_prompts
    assert held | train_prompts | val_prompts == {r["prompt"] for r in records}
    # one prompt's demonstrations stay on one side of the split
    assert sum(r["prompt"] == "Question 0?" for r in train + val) in (0, 2)


def test_comparisons_import_as_demonstrations_of_their_best_answers(tmp_path):
    """HH-RLHF has no demonstrations: `--as demonstrations` keeps each chosen answer (the
    first of tied bests in a ranking) for SFT, with the whole dialogue before it as prompt."""
    hh = write_jsonl(tmp_path / "hh.jsonl", [
        {"chosen": "\n\nHuman: Hi.\n\nAssistant: Hello!\n\nHuman: Add 2 and 3.\n\nAssistant: 5.",
         "rejected": "\n\nHuman: Hi.\n\nAssistant: Hello!\n\nHuman: Add 2 and 3.\n\nAssistant: 6."},
    ])  # fmt: skip
    ranked = write_jsonl(tmp_path / "ranked.jsonl", [
        {"prompt": "p", "responses": [{"text": "c", "rank": 1}, {"text": "a", "rank": 0},
                                      {"text": "b", "rank": 0}]},
    ])  # fmt: skip
    for source, kind in ((hh, "hh"), (ranked, "ranked")):
        out = tmp_path / f"{kind}.parquet"
        args = ["import", str(source), "--kind", kind, "--as", "demonstrations", "--out", str(out)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "data.source: files" in result.output
        [row] = read_rows(out, SFT_SCHEMA)
        if kind == "hh":
            assert row["prompt"] == "Human: Hi.\n\nAssistant: Hello!\n\nHuman: Add 2 and 3."
            assert row["response"] == "5." and row["source"] == "hh.jsonl"
        else:
            assert (row["prompt"], row["response"]) == ("p", "a")
    sft = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "response": "b"}])
    result = CliRunner().invoke(app, ["import", str(sft), "--as", "comparisons"])
    assert result.exit_code == 2 and "cannot become comparisons" in result.output


def test_cli_imports_label_studio_and_ultrafeedback_exports_as_comparisons(tmp_path):
    task = {
        "data": {
            "prompt": "Greet Ann.",
            "items": [{"id": 1, "body": "Hi Ann!"}, {"id": 2, "body": "Go away."}],
        },
        "annotations": [{"result": [{"type": "ranker", "value": {"ranker": {"r": [1, 2]}}}]}],
    }
    export = tmp_path / "project-1.json"
    export.write_text(json.dumps([task], indent=2))
    scored = write_jsonl(tmp_path / "uf.jsonl", [{"prompt": "Greet Ann.", "completions": [
        {"response": "Go away.", "overall_score": 1}, {"response": "Hi Ann!", "overall_score": 8},
    ]}])  # fmt: skip
    for source, kind in ((export, "label-studio"), (scored, "ultrafeedback")):
        out = tmp_path / f"{kind}.parquet"
        result = CliRunner().invoke(app, ["import", str(source), "--kind", kind, "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert "collect.source: files" in result.output
        [row] = read_rows(out, RANKED_SCHEMA)
        ranked = sorted(zip(row["ranks"], row["responses"], strict=True))
        assert [text for _, text in ranked] == ["Hi Ann!", "Go away."]


def one_error_line(output: str) -> str:
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, output
    return lines[0]


HH_ROW = {"chosen": "\n\nHuman: Say hi.\n\nAssistant: Hi!",
          "rejected": "\n\nHuman: Say hi.\n\nAssistant: No."}  # fmt: skip


def test_skip_bad_rows_imports_the_rest_and_writes_the_rejected_rows_beside(tmp_path):
    bad = [
        {**HH_ROW, "rejected": HH_ROW["chosen"]},  # identical answers
        {**HH_ROW, "rejected": "\n\nHuman: Say bye.\n\nAssistant: Bye."},  # another dialogue
        {**HH_ROW, "chosen": HH_ROW["chosen"] + "\n\nHuman: Thanks."},  # ends with the Human
    ]
    source = write_jsonl(tmp_path / "hh.jsonl", [HH_ROW, *bad, HH_ROW])
    out, rejected = tmp_path / "hh.parquet", tmp_path / "hh.rejected.jsonl"
    args = ["import", str(source), "--kind", "hh", "--out", str(out)]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2
    line = one_error_line(refused.output)
    assert line.startswith(f"error: {source}: row 2, field 'rejected': the same text")
    assert not out.exists() and not rejected.exists()

    result = CliRunner().invoke(app, [*args, "--skip-bad-rows"])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert f"imported 2 rows into {out}; rejected 3, with their reasons in {rejected}" in (
        " ".join(result.output.split())
    )
    assert len(read_rows(out, RANKED_SCHEMA)) == 2
    lines = [json.loads(line) for line in rejected.read_text().splitlines()]
    assert [(r["row"], r["record"]) for r in lines] == [(2, bad[0]), (3, bad[1]), (4, bad[2])]
    assert [r["reason"].split(":")[0] for r in lines] == [
        "field 'rejected'", "field 'rejected'", "field 'chosen'"
    ]  # fmt: skip


def test_prepare_refuses_a_giant_row_planted_in_data_raw(tmp_path):
    """The row limit holds on data/raw/ however the file got there, not only through import."""
    project = make_project(tmp_path / "p", {"data.source": "files", "collect.labeler": "human"})
    rows = [
        {"prompt": f"Q{i}?", "response": "A.", "task": "user", "source": "s"} for i in range(40)
    ]
    rows[6]["response"] = "y" * 2_000_000
    raw = project / "data" / "raw" / "sft.parquet"
    pa_table = pa.Table.from_pylist(rows, schema=SFT_SCHEMA)
    pq.write_table(pa_table, raw)
    done = subprocess.run([sys.executable, "-m", "rlhf.stages.prepare"], cwd=project,
                          env=clean_env(), capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2
    line = one_error_line(done.stdout + done.stderr)
    assert re.fullmatch(
        r"error: data/raw/sft.parquet: row 7, field 'response': the row is 2,000,0\d\d bytes, "
        rf"over the limit of {MAX_ROW_BYTES:,} bytes per row; split or shorten it",
        line,
    )
    assert not list((project / "data" / "prepared").glob("*.parquet"))


def test_import_says_how_many_held_out_prompts_the_data_will_give(tmp_path, monkeypatch):
    """58 demonstrations held out 2 prompts (5%), and nothing said so: every win-rate interval
    was [0, 1]. Now prepare holds out up to 32 while training keeps half, and import says."""
    monkeypatch.chdir(make_project(tmp_path / "p"))
    records = [{"prompt": f"How many cm in {i} m?", "response": f"{100 * i}."} for i in range(58)]
    result = CliRunner().invoke(app, ["import", str(write_jsonl(tmp_path / "d.jsonl", records))])
    assert result.exit_code == 0, result.output
    assert (
        "warning: 58 distinct prompts: prepare will hold out 28 for evaluation, fewer than 32"
        in result.output
    )
    assert "collect.labeler: rm:PATH, hf:DIR, check:EXTRACTOR or human" in result.output
