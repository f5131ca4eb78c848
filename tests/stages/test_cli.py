import io
import json
import os
import shutil
import subprocess
import sys

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rlhf.cli import app
from rlhf.cli.pipeline import PREFECT_HOME, prefect_environment, use_prefect_environment
from rlhf.params import describe
from rlhf.stages.support.common import ProgressLines

from conftest import REPO

runner = CliRunner()


def test_generate_answers_prompts_from_args_and_file(trained_project, tmp_path, monkeypatch):
    monkeypatch.chdir(trained_project)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Greet Alice.\n\nWhat is 2 plus 3?\n")
    result = runner.invoke(
        app,
        ["generate", "--prompt", "Shout the word river.", "--file", str(prompts), "--json",
         "--greedy", "--max-new-tokens", "12"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["prompt"] for r in lines] == [
        "Shout the word river.",
        "Greet Alice.",
        "What is 2 plus 3?",
    ]
    # greedy answers in one left-padded batch are each prompt's answer alone
    for row in lines:
        alone = runner.invoke(
            app, ["generate", "-p", row["prompt"], "--json", "--greedy", "--max-new-tokens", "12"]
        )
        assert alone.exit_code == 0, alone.output
        (answer,) = [json.loads(line) for line in alone.stdout.splitlines() if line[:1] == "{"]
        assert answer["response"] == row["response"] and row["response"].strip()


def test_generate_sampling_is_seeded(trained_project, monkeypatch):
    """The same seed gives the same sampled answers, other seeds other answers."""
    monkeypatch.chdir(trained_project)
    args = ["generate", "-p", "Greet Bob.", "-p", "Say cloud 3 times.", "--json", "--top-p", "0.9"]

    def answers(seed: int) -> list[str]:
        done = runner.invoke(app, [*args, "--temperature", "1.5", "--seed", str(seed)])
        assert done.exit_code == 0, done.output
        lines = [json.loads(line) for line in done.stdout.splitlines() if line[:1] == "{"]
        assert len(lines) == 2
        return [line["response"] for line in lines]

    first = answers(3)
    assert first == answers(3)
    assert any(answers(seed) != first for seed in (4, 5, 6))


def test_generate_refuses_a_mismatched_tokenizer(trained_project, tmp_path, monkeypatch):
    from rlhf.tokenizer.tokenizer import save_tokenizer

    monkeypatch.chdir(trained_project)
    save_tokenizer(tmp_path / "other", "bytes")
    result = runner.invoke(app, ["generate", "-p", "hi", "--tokenizer", str(tmp_path / "other")])
    assert result.exit_code == 2
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith("error: artifacts/sft/model.pt was trained with tokenizer")


def test_rlhf_run_makes_its_prefect_home_in_a_fresh_clone(tmp_path, monkeypatch):
    """A clone without .rlhf/: `rlhf run` makes the Prefect home it points Prefect at, which
    Prefect would fail to (it makes the last folder alone)."""
    monkeypatch.chdir(tmp_path)
    for key in [*prefect_environment({}), "PREFECT_HOME"]:
        monkeypatch.setenv(key, "")  # so that the test's end restores each as it was
        monkeypatch.delenv(key)
    use_prefect_environment()
    assert (tmp_path / PREFECT_HOME).is_dir()
    assert os.environ["PREFECT_HOME"] == str((tmp_path / PREFECT_HOME).resolve())


def test_params_lists_every_documented_key():
    result = runner.invoke(app, ["params"])
    assert result.exit_code == 0
    listed = {line.split("\t")[0] for line in result.output.splitlines()}
    assert {key for key, _, _ in describe()} <= listed


def test_generate_refuses_a_reward_model(trained_project, monkeypatch):
    monkeypatch.chdir(trained_project)
    result = runner.invoke(app, ["generate", "artifacts/rm/model.pt", "-p", "Greet Bob."])
    assert result.exit_code == 2
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith("error: artifacts/rm/model.pt is a reward model, which scores answers")


def test_results_go_to_stdout_and_logs_to_stderr(tmp_path):
    """`rlhf params | grep kl_coef` finds the row: tables are results, for pipes."""
    done = subprocess.run(
        [sys.executable, "-m", "rlhf.cli", "params"], cwd=tmp_path, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    rows = [line for line in done.stdout.splitlines() if "kl_coef" in line]
    assert any("ppo.kl_coef" in row and "0.2" in row for row in rows) and done.stderr == ""


def test_params_off_a_terminal_are_whole_rows_with_the_value_beside_the_default(tmp_path):
    """`rlhf params | grep kl_coef`: one tab-separated line per key, nothing cut, the value
    params.yaml (with -S) gives beside the schema's default."""
    (tmp_path / "params.yaml").write_text("grpo:\n  kl_coef: 0.2  # a comment\n")
    done = subprocess.run(
        [sys.executable, "-m", "rlhf.cli", "params", "-S", "ppo.kl_coef=0.5"], cwd=tmp_path,
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2  # ppo is not in that params.yaml: -S cannot set a key it lacks
    assert done.stderr.strip() == (
        "error: -S ppo.kl_coef=0.5: params.yaml has no key ppo.kl_coef (at its default): "
        "-S +ppo.kl_coef=0.5"
    )
    done = subprocess.run(
        [sys.executable, "-m", "rlhf.cli", "params", "-S", "grpo.kl_coef=0.3"], cwd=tmp_path,
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in done.stdout.splitlines()}
    assert rows["grpo.kl_coef"][:2] == ["0.3", "0.05"]
    assert rows["ppo.kl_coef"][:2] == ["0.2", "0.2"]
    assert rows["grpo.kl_coef"][2] == "Weight beta of the KL loss term."  # the whole meaning
    assert "# a comment" in (tmp_path / "params.yaml").read_text()  # params.yaml untouched


@pytest.mark.parametrize(
    ("override", "error"),
    [
        ("ppo.klcoef=1", "-S ppo.klcoef=1: params.yaml has no key ppo.klcoef (did you mean "
         "ppo.kl_coef?)"),
        ("+ppo.klcoef=1", "params.yaml with -S +ppo.klcoef=1: unknown key 'ppo.klcoef' (did you "
         "mean 'ppo.kl_coef'?)"),
        ("ppo.kl_coef=[1", "-S ppo.kl_coef=[1: no viable alternative at input '[1'"),
        ("ppo.kl_coef=-1", "params.yaml with -S ppo.kl_coef=-1: ppo.kl_coef = -1.0 is out of "
         "range: must be >= 0.0"),
    ],
)  # fmt: skip
def test_params_check_refuses_a_bad_override_in_one_line_before_dvc_exp_run_would(
    in_shipped_params, override, error
):
    """What `dvc exp run -S` users run first: DVC itself says "Invalid `--set-param` value",
    or with `+` writes the typo into params.yaml; here one line names it, params.yaml stays."""
    before = (in_shipped_params / "params.yaml").read_text()
    result = runner.invoke(app, ["params", "--check", "-S", override])
    assert result.exit_code == 2
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith(f"error: {error}")
    assert (in_shipped_params / "params.yaml").read_text() == before
    assert runner.invoke(app, ["params", "--check", "-S", "ppo.kl_coef=0.05"]).exit_code == 0


@pytest.fixture
def in_shipped_params(tmp_path, monkeypatch):
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_off_a_terminal_progress_is_a_line_every_so_often():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=40)
    with ProgressLines(console=console, every=0) as bar:
        task = bar.add_task("collect", total=100, extra="K=4")
        bar.update(task, advance=30)
        bar.advance(task, 20)
    with ProgressLines(console=console, every=3600) as bar:  # nothing until the work ends
        task = bar.add_task("rm", total=None, extra="")
        bar.update(task, advance=7, extra="loss 0.5")
    lines = out.getvalue().splitlines()
    assert [line.rsplit(" ", 1)[0] for line in lines] == [
        "collect: 30/100 K=4", "collect: 50/100 K=4", "collect: 50/100 K=4", "rm: 7 loss 0.5",
    ]  # fmt: skip


def one_error_line(result) -> str:
    assert "Traceback" not in result.output and "Usage:" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_a_prompts_file_with_no_prompt_is_one_error_line(tmp_path, monkeypatch):
    """Not Typer's usage box saying `give --prompt or --file`: the file was given."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    result = runner.invoke(app, ["generate", "--file", "empty.jsonl"])
    assert result.exit_code == 2
    assert one_error_line(result) == "error: empty.jsonl: holds no prompts; write one prompt a line"


def test_generate_and_score_files_meet_the_row_rule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.txt").write_text("Greet Ann.\n" + "x" * 2_000_000 + "\n")
    result = runner.invoke(app, ["generate", "--file", "prompts.txt"])
    assert result.exit_code == 2
    line = one_error_line(result)
    assert line.startswith("error: prompts.txt: row 2, field 'prompt': the row is 2,000,0")
    rows = [{"prompt": "a", "response": "b"}, {"prompt": "c", "response": "y" * 2_000_000},
            {"prompt": "d"}]  # fmt: skip
    for name, bad, problem in (
        ("big", rows[:2], "row 2, field 'response': the row is 2,000,0"),
        ("short", [rows[0], rows[2]], "row 2, field 'response': missing"),
    ):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in bad))
        result = runner.invoke(app, ["score", "--file", path.name])
        assert result.exit_code == 2
        assert one_error_line(result).startswith(f"error: {path.name}: {problem}")


def test_help_wraps_docstrings_at_the_terminal_not_at_their_own_line_breaks():
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert "resumes if interrupted; RLHF_NPROC processes." in result.output
    for info in app.registered_commands:
        paragraphs = (info.help or "").split("\n\n")
        assert all("\n" not in paragraph for paragraph in paragraphs), info.name
