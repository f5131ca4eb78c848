import json

from typer.testing import CliRunner

from rlhf.cli import app

runner = CliRunner()


def test_generate_answers_prompts_from_args_and_file(trained_project, monkeypatch):
    monkeypatch.chdir(trained_project)
    prompts = trained_project / "prompts.txt"
    prompts.write_text("Greet Alice.\n\nWhat is 2 plus 3?\n")
    result = runner.invoke(
        app,
        ["generate", "--prompt", "Shout the word river.", "--file", str(prompts), "--json",
         "--greedy", "--max-new-tokens", "12"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["prompt"] for r in lines] == [
        "Shout the word river.", "Greet Alice.", "What is 2 plus 3?"
    ]  # fmt: skip
    assert all(isinstance(r["response"], str) for r in lines)


def test_generate_sampling_is_seeded(trained_project, monkeypatch):
    monkeypatch.chdir(trained_project)
    args = ["generate", "-p", "Greet Bob.", "-p", "Say cloud 3 times.", "--json", "--top-p", "0.9"]
    first = runner.invoke(app, [*args, "--seed", "3"]).stdout
    assert first == runner.invoke(app, [*args, "--seed", "3"]).stdout


def test_generate_refuses_a_mismatched_tokenizer(trained_project, tmp_path, monkeypatch):
    from rlhf.data.tokenizer import save_tokenizer

    monkeypatch.chdir(trained_project)
    save_tokenizer(tmp_path / "other", "bytes")
    result = runner.invoke(app, ["generate", "-p", "hi", "--tokenizer", str(tmp_path / "other")])
    assert result.exit_code == 2
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith("error: artifacts/sft/model.pt was trained with tokenizer")


def test_params_lists_every_documented_key():
    result = runner.invoke(app, ["params"])
    assert result.exit_code == 0
    for key in ("sft.lr", "tokenizer.kind", "data.demo_noise", "model.block_size"):
        assert key in result.output
