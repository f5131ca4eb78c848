import json
import shutil
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from rlhf.algorithms.reward_model import score_rows
from rlhf.algorithms.scorers import RewardModelScorer
from rlhf.cli import app
from rlhf.data.comparisons import response_lengths
from rlhf.data.schemas import (
    COMPARISON_SCHEMA,
    PROMPT_SCHEMA,
    SFT_SCHEMA,
    read_rows,
    write_rows,
)
from rlhf.eval.rm_accuracy import comparison_metrics
from rlhf.models import checkpoint
from rlhf.params import ParamsError, parse_params
from rlhf.project import paths
from rlhf.project.metric_files import read_metrics
from rlhf.synthetic.collection import gold_scores, scored, with_mismatched
from rlhf.tokenizer.tokenizer import load_tokenizer

from conftest import clean_env, make_project, run_module, write_params

runner = CliRunner()
RM_KEYS = {"acc_noisy", "acc_gold", "acc_gold_margin_ge_0_2", "acc_gold_by_margin",
           "acc_gold_by_task", "reward_length_corr", "reward_std", "reward_shift"}  # fmt: skip


def test_collect_writes_ranked_samples_with_gold_scores(trained_project):
    metrics = read_metrics("collect", trained_project)
    assert abs(metrics["label_flip_share"] - 0.25) < 0.05
    rows = read_rows(
        trained_project / "data" / "collected" / "comparisons_train.parquet", COMPARISON_SCHEMA
    )
    val = read_rows(
        trained_project / "data" / "collected" / "comparisons_val.parquet", COMPARISON_SCHEMA
    )
    # K = 3 samples, plus one mismatched and one exploration answer on training rows only
    assert all(sorted(r["ranks"]) == [0, 1, 2, 3, 4] and len(r["gold_scores"]) == 5 for r in rows)
    assert all(r["source"] == "sft-samples+mismatched+explore" for r in rows)
    assert all(sorted(r["ranks"]) == [0, 1, 2] and len(r["gold_scores"]) == 3 for r in val)
    assert not {r["prompt"] for r in rows} & {r["prompt"] for r in val}
    sampled_by_task: dict[str, set[str]] = {}
    for r in rows:
        sampled_by_task.setdefault(r["task"], set()).update(r["responses"][:3])
    assert all(r["responses"][3] in sampled_by_task[r["task"]] for r in rows)


def test_mismatched_answers_come_from_sibling_prompts_and_are_judged():
    rows = [
        {"prompt": p, "task": t, "source": "s", "responses": [a], "scores": [1.0]}
        for p, t, a in [
            ("Greet Alice.", "greet", "Hello, Alice!"),
            ("Greet Bob.", "greet", "Hello, Bob!"),
            ("What is 2 plus 3?", "add", "2 + 3 = 5."),
            ("What is 1 plus 1?", "add", "1 + 1 = 2."),
        ]
    ]
    out = with_mismatched(rows, 2, seed=0)
    assert [r["responses"][1:] for r in out] == [
        ["Hello, Bob!"] * 2,
        ["Hello, Alice!"] * 2,
        ["1 + 1 = 2."] * 2,
        ["2 + 3 = 5."] * 2,
    ]
    scored(out, gold_scores)  # the labeler scores the new answers only
    assert out[0]["scores"] == [1.0, 0.2, 0.2] and out[0]["source"] == "s+mismatched"
    assert rows[0]["scores"] == [1.0]  # the rows themselves are left as they were
    assert with_mismatched(rows, 0, seed=0) == rows


def comparison_accuracy(project: Path, model_file: Path, comparisons: Path) -> dict:
    """`comparison_metrics` of `model_file`'s rewards (its reward head, read as the reward
    model reads it) on a comparisons file of the project."""
    tokenizer = load_tokenizer(project / paths.TOKENIZER)
    model = checkpoint.load_model(project / model_file, tokenizer, torch.device("cpu"))[0]
    rows = read_rows(project / comparisons, COMPARISON_SCHEMA)
    pooling = checkpoint.load(project / paths.RM_MODEL)["pooling"]
    rewards = score_rows(model.eval(), tokenizer, rows, pooling=pooling, batch_size=64)
    return comparison_metrics(rows, rewards, response_lengths(tokenizer, rows))


def test_rm_metrics_and_normalized_checkpoint(trained_project):
    metrics = read_metrics("rm", trained_project)
    assert set(metrics) >= RM_KEYS
    held_out = comparison_accuracy(trained_project, paths.RM_MODEL, paths.COMPARISONS_VAL)
    for key in ("acc_gold", "acc_noisy", "pairs_by_margin"):  # the saved model's numbers
        assert metrics[key] == held_out[key], key
    assert metrics["reward_std"] > 0
    payload = torch.load(trained_project / paths.RM_MODEL, map_location="cpu", weights_only=True)
    assert payload["kind"] == "reward" and payload["pooling"] == "last"
    assert payload["reward_std"] == pytest.approx(metrics["reward_std"], abs=1e-6)


def test_the_reward_model_learns_its_training_comparisons(trained_project):
    """The tiny config's reward model takes 6 steps and is judged on about 20 held-out pairs
    the gold judge decides: its held-out gold accuracy was 0.31 to 0.89 over seeds 1 to 8
    (0.75 at the tests' seed 7), at or below chance at three of them, so it cannot show
    learning (the default run does: tests/unit/test_default_run.py). What it trained on can:
    on its ~480 training pairs it orders the noisy labels the way they say 0.05 to 0.17 more
    often than the SFT checkpoint it starts from (whose reward head is untrained) at each of
    those seeds, and 0.60 to 0.64 of the time, where its start scored 0.45 to 0.57."""
    fit = {
        name: comparison_accuracy(trained_project, model, paths.COMPARISONS_TRAIN)["acc_noisy"]
        for name, model in (("start", paths.SFT_MODEL), ("trained", paths.RM_MODEL))
    }
    assert fit["trained"] >= max(fit["start"] + 0.02, 0.55), fit


def test_score_cli_centres_demonstrations_and_prints_json(trained_project, tmp_path, monkeypatch):
    monkeypatch.chdir(trained_project)
    result = runner.invoke(
        app,
        ["score", "-p", "Greet Alice.", "-r", "Hello, Alice!", "-p", "Greet Bob.",
         "-r", "Hello, Alice!", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["response"] for r in records] == ["Hello, Alice!", "Hello, Alice!"]
    std = read_metrics("rm", trained_project)["reward_std"]
    assert all(abs(r["z"] * std - r["reward"]) < 1e-5 for r in records)
    # centred: the demonstrations the stage normalized on (rm.norm_samples) average 0
    norm = yaml.safe_load((trained_project / "params.yaml").read_text())["rm"]["norm_samples"]
    demos = read_rows(trained_project / "data/prepared/sft_train.parquet", SFT_SCHEMA)[:norm]
    file = tmp_path / "demos.jsonl"
    file.write_text("".join(json.dumps({"prompt": d["prompt"], "response": d["response"]}) + "\n"
                            for d in demos))  # fmt: skip
    scored_demos = runner.invoke(app, ["score", "--file", str(file), "--json"])
    assert scored_demos.exit_code == 0, scored_demos.output
    rewards = [json.loads(line)["reward"] for line in scored_demos.stdout.splitlines()]
    assert len(rewards) == norm and abs(sum(rewards) / norm) < 1e-4 and max(rewards) > 0.01


def test_score_cli_rejects_unpaired_input_and_policy_checkpoints(trained_project, monkeypatch):
    monkeypatch.chdir(trained_project)
    result = runner.invoke(app, ["score", "-p", "a", "-p", "b", "-r", "x"])
    assert result.exit_code != 0 and "2 --prompt but 1 --response" in result.output
    result = runner.invoke(app, ["score", "artifacts/sft/model.pt", "-p", "a", "-r", "x"])
    assert result.exit_code != 0 and "policy checkpoint" in result.output


def test_imported_hh_comparisons_train_the_reward_model(trained_project, tmp_path):
    """HH-RLHF transcripts imported as comparisons train a reward model that prefers what
    they chose: a greeting over a rebuff, for names it never saw."""
    project = make_project(tmp_path / "p")
    for part in ("artifacts", "data"):  # reuse tokenizer and SFT: only collect + rm run here
        shutil.copytree(trained_project / part, project / part, dirs_exist_ok=True)
    records = [
        {
            "chosen": f"\n\nHuman: Greet {n}.\n\nAssistant: Hello, {n}!",
            "rejected": f"\n\nHuman: Greet {n}.\n\nAssistant: Go away.",
        }
        for n in ("Ann", "Ben", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal", "Ida", "Jo")
    ]
    source = tmp_path / "hh.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in records))
    out = project / "data" / "raw" / "comparisons.parquet"
    result = runner.invoke(app, ["import", str(source), "--kind", "hh", "--out", str(out)])
    assert result.exit_code == 0, result.output
    write_params(project, {"collect.source": "files", "rm.epochs": 10})
    run_module("rlhf.stages.collect", project)
    rows = read_rows(
        project / "data" / "collected" / "comparisons_train.parquet", COMPARISON_SCHEMA
    )
    assert rows[0]["prompt"].startswith("Human: Greet") and rows[0]["gold_scores"] == []
    run_module("rlhf.stages.rm", project)
    metrics = read_metrics("rm", project)
    assert metrics["acc_gold"] is None and metrics["acc_noisy"] == 1.0  # held-out pairs
    tokenizer = load_tokenizer(project / "artifacts" / "tokenizer")
    scorer = RewardModelScorer.load(project / "artifacts" / "rm" / "model.pt", tokenizer, "cpu")
    prompts = [f"Human: Greet {n}." for n in ("Kim", "Lou", "Max")]
    greeted = scorer(prompts, [f"Hello, {n}!" for n in ("Kim", "Lou", "Max")])
    rebuffed = scorer(prompts, ["Go away."] * 3)
    assert (greeted > rebuffed).all(), (greeted, rebuffed)


def test_a_reward_model_labels_sampled_answers_to_any_prompts(trained_project, tmp_path):
    """`collect.labeler: rm:PATH`, AI feedback: an earlier run's reward model ranks the K
    sampled answers to prompts the task suite cannot parse (the gold judge would refuse them)
    by its scores as they are, and the reward model trains on those rankings."""
    project = make_project(tmp_path / "p", {"collect.labeler": "rm:labeler.pt"})
    for part in ("artifacts", "data"):
        shutil.copytree(trained_project / part, project / part, dirs_exist_ok=True)
    shutil.copy(trained_project / "artifacts" / "rm" / "model.pt", project / "labeler.pt")
    prompts = project / "data" / "prepared" / "prompts_train.parquet"
    own = [
        {**r, "prompt": f"Please answer: {r['prompt']}", "task": "user", "source": "files"}
        for r in read_rows(prompts, PROMPT_SCHEMA)
    ]
    write_rows(prompts, own, PROMPT_SCHEMA)
    run_module("rlhf.dvcfile", project)
    dvc_yaml = yaml.safe_load((project / "dvc.yaml").read_text())
    assert "labeler.pt" in dvc_yaml["stages"]["collect"]["deps"]
    run_module("rlhf.stages.collect", project)
    metrics = read_metrics("collect", project)
    assert "gold_mean_of_samples" not in metrics and 0 <= metrics["labeler_tie_share"] < 1
    rows = read_rows(
        project / "data" / "collected" / "comparisons_train.parquet", COMPARISON_SCHEMA
    )
    assert rows[0]["prompt"].startswith("Please answer: ") and rows[0]["gold_scores"] == []
    assert all(len(r["responses"]) == 5 for r in rows)  # K = 3, a mismatched and an explored
    tokenizer = load_tokenizer(project / "artifacts" / "tokenizer")
    labeler = RewardModelScorer.load(project / "labeler.pt", tokenizer, torch.device("cpu"))
    for row in rows[:20]:
        scores = labeler([row["prompt"]] * 5, row["responses"]).tolist()
        for i, j in combinations(range(5), 2):
            if abs(scores[i] - scores[j]) > 1e-4:  # the better-scored answer ranks first
                assert (scores[i] > scores[j]) == (row["ranks"][i] < row["ranks"][j])
    run_module("rlhf.stages.rm", project)
    rm = read_metrics("rm", project)
    assert rm["acc_gold"] is None and rm["acc_noisy"] > 0.5  # it learns its teacher's order
    with pytest.raises(ParamsError, match=r"labeler = 'human:x' is not 'gold', 'human', 'rm:PATH'"):
        parse_params({"collect": {"labeler": "human:x"}})


def test_human_labeling_refuses_more_answers_than_letters_up_front(trained_project, tmp_path):
    collect = {"labeler": "human", "k": 24, "explore": 2, "mismatched": 3}
    project = make_project(tmp_path / "p", {f"collect.{k}": v for k, v in collect.items()})
    for part in ("artifacts", "data"):
        shutil.copytree(trained_project / part, project / part, dirs_exist_ok=True)
    refused = subprocess.run([sys.executable, "-m", "rlhf.stages.collect"], cwd=project,
                             env=clean_env(), capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "include_demo + explore + mismatched = 29 answers per item" in refused.stderr
    assert not (project / "labeling" / "queue.parquet").exists()
