import csv
import json
import re
import shutil
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from rlhf.cli import app
from rlhf.cpu import cpu_signature
from rlhf.data.schemas import PROMPT_SCHEMA, read_rows, write_rows
from rlhf.eval import plots
from rlhf.project.metric_files import read_metrics
from rlhf.train.curves import read_curve

from conftest import clean_env, make_project, run_module, write_params

PNG = b"\x89PNG\r\n\x1a\n"


def eval_metrics(project):
    return read_metrics("eval", project)


def read_metrics_file(project, name):
    return json.loads((project / name).read_text())


POLICIES = {"sft", "ppo", "grpo", "dpo"}  # the tiny config's rl_algorithms: ppo, grpo
PAIRS = {"ppo_vs_sft", "grpo_vs_sft", "grpo_vs_ppo", "dpo_vs_sft", "dpo_vs_ppo", "dpo_vs_grpo"}
JUDGES = {"gold", "rm"}


def test_metrics_have_the_stable_headline_keys(trained_project):
    metrics = eval_metrics(trained_project)
    for key in ("gold_sampled", "gold_greedy", "rm_sampled", "kl_to_sft", "response_length"):
        assert set(metrics[key]) == POLICIES, key
    rate_keys = ("win_rate", "win_rate_ci95", "win_rate_decisive", "win_rate_decisive_ci95",
                 "tie_rate", "win_rate_greedy")  # fmt: skip
    for key in rate_keys:  # by judge (evaluate.judges: gold, rm), then by pair
        assert set(metrics[key]) == JUDGES and all(set(v) == PAIRS for v in metrics[key].values())
    for judge in JUDGES:
        ci = metrics["win_rate_ci95"][judge]["ppo_vs_sft"]
        assert ci["low"] <= metrics["win_rate"][judge]["ppo_vs_sft"] <= ci["high"]
        assert 0.0 <= metrics["win_rate_greedy"][judge]["ppo_vs_sft"] <= 1.0
    assert metrics["kl_to_sft"]["sft"] == 0.0 and metrics["kl_to_sft"]["ppo"] > 0.0
    # exact over the vocabulary: never below 0, however little a policy moved
    assert min(metrics["kl_to_sft"].values()) >= 0.0 and "ppo" in metrics["kl_to_sft_sampled"]
    heldout = read_rows(trained_project / "data/prepared/prompts_heldout.parquet", PROMPT_SCHEMA)
    assert metrics["prompts"] == len(heldout)
    assert set(metrics["by_task"]["ppo"]) == {r["task"] for r in heldout}


def test_every_policy_meets_the_baselines(trained_project):
    """The tiny config sweeps temperatures 0.7 and 1 on the validation prompts and draws
    best-of-2 and best-of-4 from 4 SFT answers per prompt: each policy's best temperature is
    the one its validation gold score was highest at, its win rates at that temperature,
    greedy against greedy and against the best-of-n nearest its KL are headline numbers with
    intervals, and best-of-n's KL lies under its closed-form bound."""
    metrics = eval_metrics(trained_project)
    assert metrics["primary_judge"] == "gold"
    for key in ("win_rate_best_temperature", "win_rate_greedy"):
        for judge in JUDGES:
            for pair, rate in metrics[key][judge].items():
                ci = metrics[f"{key}_ci95"][judge][pair]
                assert ci["low"] <= rate <= ci["high"], (key, judge, pair)
    for policy in POLICIES:
        sweep = metrics["temperature_sweep"][policy]
        assert set(sweep) == {"0.7", "1.0"}
        best = max(sweep, key=lambda t: sweep[t]["score"])
        assert metrics["best_temperature"][policy] == float(best)
        assert min(point["kl_to_sft"] for point in sweep.values()) >= 0.0
    assert metrics["temperature_sweep"]["sft"]["1.0"]["kl_to_sft"] == 0.0
    assert metrics["temperature_sweep"]["sft"]["0.7"]["kl_to_sft"] > 0.0
    best_of_n = metrics["best_of_n"]
    assert set(best_of_n) == {"2", "4"}
    for n, measured in best_of_n.items():
        assert 0.0 <= measured["kl_to_sft"] <= measured["kl_bound"] + 1e-4, n
        assert set(measured["win_rate"]) == JUDGES
    for policy, n in metrics["best_of_n_matched"].items():
        kl = metrics["kl_to_sft"][policy]
        nearest = min(best_of_n, key=lambda m: abs(best_of_n[m]["kl_to_sft"] - kl))
        assert best_of_n[str(n)]["kl_to_sft"] == best_of_n[nearest]["kl_to_sft"]
    report = (trained_project / "reports" / "eval.md").read_text()
    assert report.index("## Against the baselines") < report.index("## Policies")
    assert (trained_project / "reports" / "figures" / "score_against_kl.png").read_bytes()[
        :8
    ] == PNG


def test_each_policys_headline_file_holds_its_numbers_under_short_keys(trained_project):
    """metrics/eval/<policy>.json, a row each in `dvc metrics show`: the gold judge's win rates
    over SFT's four baselines, gold scores and KL, the very numbers of the details."""
    metrics = eval_metrics(trained_project)
    assert {f.stem for f in (trained_project / "metrics" / "eval").iterdir()} == POLICIES
    headline = {p: read_metrics_file(trained_project, f"metrics/eval/{p}.json") for p in POLICIES}
    for policy, shown in headline.items():
        assert shown["gold"] == metrics["gold_sampled"][policy]
        assert shown["gold_greedy"] == metrics["gold_greedy"][policy]
        assert shown["kl"] == metrics["kl_to_sft"][policy]
    assert set(headline["sft"]) == {"gold", "gold_greedy", "kl"}  # no win rate over itself
    for policy in POLICIES - {"sft"}:
        pair = f"{policy}_vs_sft"
        assert headline[policy] == {
            "win": metrics["win_rate"]["gold"][pair],
            "win_t": metrics["win_rate_best_temperature"]["gold"][pair],
            "win_greedy": metrics["win_rate_greedy"]["gold"][pair],
            "win_bon": metrics["win_rate_vs_best_of_n"]["gold"][policy],
            "gold": metrics["gold_sampled"][policy],
            "gold_greedy": metrics["gold_greedy"][policy],
            "kl": metrics["kl_to_sft"][policy],
        }


def test_evaluation_agrees_with_the_ppo_stage_on_the_same_samples(trained_project):
    """Same seed, one sample per prompt, same length cap: the two stages draw the same answers,
    so their gold scores, win rates by the gold judge and by the reward model PPO optimized, and
    KL must agree."""
    metrics = eval_metrics(trained_project)
    ppo = read_metrics("ppo", trained_project)
    assert metrics["gold_sampled"]["sft"] == ppo["gold_sampled_sft"]
    assert metrics["gold_sampled"]["ppo"] == ppo["gold_sampled"]
    assert set(ppo["win_rate_vs_sft"]) == JUDGES  # rl.reward: rm
    for judge in JUDGES:
        assert metrics["win_rate"][judge]["ppo_vs_sft"] == ppo["win_rate_vs_sft"][judge]
    assert metrics["kl_to_sft"]["ppo"] == pytest.approx(ppo["kl_to_sft"], abs=1e-3)


def test_ties_and_decisive_win_rates_add_up(trained_project):
    """win rate (ties half) = decisive rate * (1 - tie rate) + tie rate / 2, pair by pair."""
    metrics = eval_metrics(trained_project)
    for judge, rates in metrics["win_rate"].items():
        for pair, rate in rates.items():
            ties = metrics["tie_rate"][judge][pair]
            decisive = metrics["win_rate_decisive"][judge][pair]
            if decisive is None:
                assert ties == 1.0 and rate == 0.5
                continue
            assert rate == pytest.approx(decisive * (1 - ties) + ties / 2, abs=2e-4)
            ci = metrics["win_rate_decisive_ci95"][judge][pair]
            assert ci["low"] <= decisive <= ci["high"]


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_each_rl_policy_has_an_overoptimization_curve(trained_project, algorithm):
    with open(trained_project / "metrics" / "eval_overoptimization.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r["policy"] == algorithm]
    assert [int(r["step"]) for r in rows] == [0, 2, 4]  # rl.snapshot_every 2, 4 steps
    assert float(rows[0]["kl_to_sft"]) == 0.0
    metrics = eval_metrics(trained_project)
    assert float(rows[-1]["gold_score"]) == metrics["gold_sampled"][algorithm]
    assert float(rows[-1]["rm_score"]) == metrics["rm_sampled"][algorithm]
    snapshot = torch.load(
        trained_project / f"artifacts/{algorithm}/snapshots/step_00002.pt", weights_only=True
    )
    assert snapshot["kind"] == "policy" and snapshot["step"] == 2


def test_report_shows_tables_figures_and_answers(trained_project):
    reports = trained_project / "reports"
    text = (reports / "eval.md").read_text()
    metrics = eval_metrics(trained_project)
    for judge in JUDGES:
        rate = metrics["win_rate"][judge]["ppo_vs_sft"]
        assert f"| ppo vs sft | {rate:.3f} |" in text
        assert f"**Judged by `{judge}`**" in text
    assert "## By task family" in text and "## Warning signs" in text
    heldout = read_rows(trained_project / "data/prepared/prompts_heldout.parquet", PROMPT_SCHEMA)
    first_of_task = {}
    for row in heldout:
        first_of_task.setdefault(row["task"], row["prompt"])
    for prompt in first_of_task.values():  # examples_per_task: 1
        assert f"`{prompt}`" in text
    images = re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)
    assert len(images) == 6  # win rates by each judge, gold scores, baselines, curves, losses
    for image in images:
        assert (reports / image).read_bytes()[:8] == PNG


def test_run_returns_the_headline_numbers(trained_project, tmp_path, monkeypatch):
    project = make_project(tmp_path / "p")
    for part in ("data", "artifacts", "metrics", "dvclive"):
        shutil.copytree(trained_project / part, project / part, dirs_exist_ok=True)
    monkeypatch.chdir(project)
    from rlhf.stages import evaluate

    numbers = evaluate.run()
    metrics = eval_metrics(project)
    assert numbers["win_rate.gold.ppo_vs_sft"] == metrics["win_rate"]["gold"]["ppo_vs_sft"]
    assert numbers["win_rate.rm.dpo_vs_ppo"] == metrics["win_rate"]["rm"]["dpo_vs_ppo"]
    assert numbers["gold_greedy.sft"] == metrics["gold_greedy"]["sft"]
    assert metrics == eval_metrics(trained_project)  # same params and seed, same numbers
    assert not any(k.startswith("by_task") for k in numbers)


def test_a_failed_report_leaves_the_previous_outputs(trained_project, tmp_path, monkeypatch):
    project = make_project(tmp_path / "p")
    for part in ("data", "artifacts", "metrics", "dvclive", "reports"):
        shutil.copytree(trained_project / part, project / part, dirs_exist_ok=True)
    outputs = [*project.glob("metrics/eval/*.json"), project / "metrics/details/eval.json"]
    assert len(outputs) == len(POLICIES) + 1
    before = {
        path: path.read_bytes()
        for path in [*project.glob("reports/**/*"), *outputs]
        if path.is_file()
    }

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(plots, "training_curves", broken)
    monkeypatch.chdir(project)
    from rlhf.stages import evaluate

    with pytest.raises(RuntimeError, match="disk full"):
        evaluate.run()
    after = {path: path.read_bytes() for path in before}
    assert after == before
    assert sorted(p.name for p in (project / "reports").iterdir()) == ["eval.md", "figures"]


def test_prompts_without_a_gold_judge_are_judged_by_the_others(trained_project, tmp_path):
    """Off the task suite the gold judge steps aside; the reward model, a rule and two
    pairwise judges still give win rates with intervals, each under its own name: the reward
    model shown both answers (`pairwise:rm`) gives exactly the reward model's numbers."""
    judges = ["gold", "rm", "rule:contains_number", "pairwise:rm", "pairwise:rule:shorter"]
    project = make_project(tmp_path / "p", {"evaluate.judges": judges})
    for part in ("data", "artifacts", "metrics", "dvclive"):
        shutil.copytree(trained_project / part, project / part, dirs_exist_ok=True)
    heldout = project / "data/prepared/prompts_heldout.parquet"
    rows = [{**r, "source": "files"} for r in read_rows(heldout, PROMPT_SCHEMA)]
    write_rows(heldout, rows, PROMPT_SCHEMA)
    run_module("rlhf.stages.evaluate", project)
    metrics = eval_metrics(project)
    assert "gold_sampled" not in metrics
    assert set(metrics["rm_sampled"]) == POLICIES
    assert set(metrics["win_rate"]) == set(metrics["win_rate_ci95"]) == set(judges[1:])
    assert set(metrics["win_rate"]["rule:contains_number"]) == PAIRS
    rate_keys = ("win_rate", "win_rate_ci95", "win_rate_decisive", "tie_rate", "win_rate_greedy")
    for key in rate_keys:
        assert metrics[key]["pairwise:rm"] == metrics[key]["rm"], key
        assert set(metrics[key]["pairwise:rule:shorter"]) == PAIRS
    text = (project / "reports" / "eval.md").read_text()
    assert "**Judged by `rule:contains_number`**, the reward function contains_number" in text
    assert "**Judged by `pairwise:rule:shorter`**, the pairwise rule shorter" in text
    assert (project / "reports" / "figures" / "win_rates_rule_contains_number.png").is_file()
    text = (project / "reports" / "eval.md").read_text()
    assert "no gold judge" in text
    write_params(project, {"evaluate.judges": ["rm", "rule:gold"]})
    refused = subprocess.run([sys.executable, "-m", "rlhf.stages.evaluate"], cwd=project,
                             env=clean_env(), capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "names 'rule:gold', the task suite's judge, but the held-out prompts" in refused.stderr


def test_cli_report_prints_where_it_is(trained_project, monkeypatch):
    monkeypatch.chdir(trained_project)
    opened = []
    monkeypatch.setattr("typer.launch", lambda target, **kw: opened.append(target) or 0)
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    result = CliRunner().invoke(app, ["report", "--open"])
    assert result.exit_code == 0, result.output
    where = str((trained_project / "reports" / "eval.md").resolve())
    assert where in result.output.replace("\n", "")
    assert opened == [where]
    shown = CliRunner().invoke(app, ["report"])
    assert "Evaluation report" in shown.output


def test_cli_report_open_without_a_display_says_so_in_one_line(trained_project, monkeypatch):
    """A headless host: no xdg-open noise, one line naming the report and what to run."""
    monkeypatch.chdir(trained_project)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr("typer.launch", lambda target, **kw: pytest.fail("launched"))
    result = CliRunner().invoke(app, ["report", "--open"])
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: no viewer to open ") and "`rlhf report` prints it" in line


def test_cli_report_says_when_the_committed_outputs_come_from_another_cpu(
    trained_project, tmp_path, monkeypatch
):
    project = tmp_path / "p"
    shutil.copytree(trained_project / "reports", project / "reports")
    monkeypatch.chdir(project)
    assert "another CPU" not in CliRunner().invoke(app, ["report"]).stderr  # none recorded
    (project / "docs").mkdir()
    shutil.copy(trained_project / "params.yaml", project / "params.yaml")
    other = cpu_signature("avx2") | {"model": "Intel Xeon", "kernels": "native"}
    (project / "docs" / "committed-cpu.json").write_text(json.dumps(other))
    result = CliRunner().invoke(app, ["report"])
    assert result.exit_code == 0 and "Evaluation report" in result.stdout
    (line,) = result.stderr.splitlines()
    assert "committed outputs were made on another CPU (Intel Xeon, native kernels" in line
    assert "`rlhf reproduced` checks that they lie within the committed seed spread" in line


def test_cli_report_before_evaluate_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["report"])
    assert result.exit_code == 2
    assert "dvc repro evaluate" in result.output


def test_the_evaluation_follows_rl_algorithms(trained_project, tmp_path):
    """Each RL algorithm named in rl_algorithms is evaluated under its name, beside SFT and
    DPO; others are not, even when an old folder of theirs lies in artifacts/."""
    reinforce = {"steps": 4, "batch_size": 8, "minibatch_size": 4, "lr": 0.001}
    project = make_project(tmp_path / "p", {"rl_algorithms": ["reinforce"], "reinforce": reinforce})
    for part in ("data", "metrics", "artifacts", "dvclive"):
        shutil.copytree(trained_project / part, project / part, dirs_exist_ok=True)
    run_module("rlhf.stages.rl", project, "reinforce")
    run_module("rlhf.stages.evaluate", project)
    metrics = eval_metrics(project)
    assert set(metrics["gold_sampled"]) == {"sft", "reinforce", "dpo"}
    assert set(metrics["win_rate"]["gold"]) == {
        "reinforce_vs_sft",
        "dpo_vs_sft",
        "dpo_vs_reinforce",
    }
    assert metrics["kl_to_sft"]["reinforce"] > 0
    passes = read_curve(
        project / "dvclive" / "reinforce" / "plots" / "metrics", "update_epochs_run"
    )
    assert {value for _, value in passes} == {1}  # one pass
