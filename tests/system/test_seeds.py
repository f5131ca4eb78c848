"""Seed-to-seed spread: `rlhf seeds` runs the pipeline at several seeds as DVC experiments and
`rlhf compare` reads every experiment's numbers against that spread."""

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlhf.cli import app
from rlhf.eval.seeds import NOISE_STDS, Spread, compared_numbers, params_changed, spreads
from rlhf.project import experiments
from rlhf.project.experiments import RecordedRun

from conftest import REPO, clean_env, sh, stages_ran


def test_a_spread_is_the_seeds_mean_and_sample_deviation_and_flags_what_leaves_it():
    (spread,) = spreads([{"k": 0.50}, {"k": 0.54}, {"k": 0.58}]).values()
    assert spread == Spread(
        mean=pytest.approx(0.54), std=pytest.approx(0.04), low=0.50, high=0.58, seeds=3
    )
    assert spread.within_noise(0.61) and not spread.within_noise(0.63)  # 2 std: 0.46 to 0.62
    assert spreads([{"k": 1.0, "only_here": 2.0}, {"k": 3.0}]).keys() == {"k"}
    (same,) = spreads([{"k": 0.7}] * 3).values()  # mean 0.6999999999999998, std 0
    assert same.within_noise(0.7) and not same.within_noise(0.7001)


def test_the_compared_numbers_are_the_headline_ones_named_by_file():
    metrics = {"eval/ppo": {"win": 0.6, "kl": 1.1, "other": 2.0}, "rm": {"acc": 0.8, "loss": 0.5}}
    assert compared_numbers(metrics) == {"eval/ppo:win": 0.6, "eval/ppo:kl": 1.1, "rm:acc": 0.8}
    assert params_changed({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == ["b=2", "c=None"]


def recorded(name: str, params: dict, win_rate: float, acc: float) -> RecordedRun:
    """A run of one commit as `recorded_runs` reads it, with two of the compared numbers."""
    metrics = {"eval/ppo": {"win": win_rate}, "rm": {"acc": acc}}
    return RecordedRun(name, "c0ffee", params, metrics)


STRONG_KL = {"seed": 7, "ppo.kl_coef": 0.5}


def seed_runs(first: str) -> list[RecordedRun]:
    """Seeds 7 (named `first`), 8 and 9 of kl_coef 0.2: win rates 0.50, 0.54, 0.58 (mean
    0.54, std 0.04) and gold accuracies 0.80, 0.82, 0.84 (0.82, 0.02)."""
    seeds = ((first, 7, 0.50, 0.80), ("seed-8", 8, 0.54, 0.82), ("seed-9", 9, 0.58, 0.84))
    return [recorded(name, {"seed": seed, "ppo.kl_coef": 0.2}, win, acc)
            for name, seed, win, acc in seeds]  # fmt: skip


def record(monkeypatch, runs: list[RecordedRun], committed: dict) -> None:
    """`rlhf compare` reads `runs`, and `committed` as the params HEAD commits."""
    monkeypatch.setattr(experiments, "recorded_runs", lambda root: runs)
    monkeypatch.setattr(experiments, "committed_params", lambda root: committed)


def test_compare_marks_an_experiments_number_within_two_seed_deviations_and_one_outside(
    monkeypatch,
):
    """Seeds at win rates 0.50, 0.54, 0.58 (mean 0.54, std 0.04) and gold accuracies 0.80,
    0.82, 0.84 (0.82, 0.02): an experiment's 0.61 lies within 2 std (`~`, noise), its 0.90
    does not (`!`)."""
    runs = [*seed_runs("workspace"), recorded("strong-kl", STRONG_KL, 0.61, 0.90)]
    record(monkeypatch, runs, committed={"seed": 1234, "ppo.kl_coef": 0.2})
    table = CliRunner().invoke(app, ["compare"])
    assert table.exit_code == 0, table.output
    assert table.stdout.splitlines()[1:] == [
        "eval/ppo:win\t0.540 ± 0.040 (0.500 – 0.580)\t0.610 ~",
        "rm:acc\t0.820 ± 0.020 (0.800 – 0.840)\t0.900 !",
    ]
    compared = json.loads(CliRunner().invoke(app, ["compare", "--json"]).stdout)
    assert compared["experiments"]["strong-kl"]["within_noise"] == {
        "eval/ppo:win": True, "rm:acc": False,
    }  # fmt: skip


def test_a_workspace_that_changed_params_is_compared_against_heads_seeds(monkeypatch):
    """`dvc exp run -S ppo.kl_coef=0.5` without `--temp` leaves the change in the workspace:
    the spread stays that of HEAD's params (the seed experiments), and the workspace is the
    variant read against it, named by its change."""
    runs = [recorded("workspace", STRONG_KL, 0.61, 0.90), *seed_runs("seed-7")]
    record(monkeypatch, runs, committed={"seed": 7, "ppo.kl_coef": 0.2})
    compared = json.loads(CliRunner().invoke(app, ["compare", "--json"]).stdout)
    assert sorted(compared["seeds"]) == ["7", "8", "9"]
    assert compared["spread"]["rm:acc"]["mean"] == pytest.approx(0.82)
    assert compared["experiments"] == {"workspace": {
        "changes": ["ppo.kl_coef=0.5"],
        "numbers": {"eval/ppo:win": 0.61, "rm:acc": 0.90},
        "within_noise": {"eval/ppo:win": True, "rm:acc": False},
    }}  # fmt: skip
    table = CliRunner().invoke(app, ["compare"])
    assert "spread is over 3 seeds of the params HEAD (c0ffee) commits" in table.stderr


def test_with_one_seed_compare_says_there_is_no_spread_and_marks_nothing(monkeypatch):
    """One seed's standard deviation is 0: every difference would read as `!`."""
    runs = [seed_runs("workspace")[0], recorded("strong-kl", STRONG_KL, 0.61, 0.90)]
    record(monkeypatch, runs, committed={"seed": 7, "ppo.kl_coef": 0.2})
    table = CliRunner().invoke(app, ["compare"])
    assert "1 run(s) of the params HEAD (c0ffee) commits, so no spread" in table.stderr
    assert [row.split("\t")[-1] for row in table.stdout.splitlines()[1:]] == ["0.610", "0.900"]
    compared = json.loads(CliRunner().invoke(app, ["compare", "--json"]).stdout)
    assert compared["experiments"]["strong-kl"]["within_noise"] == {}


TERMINAL = clean_env() | {"COLUMNS": "120"}  # the width the README's tables must fit


def readme_exp_show() -> list[str]:
    """The README's `dvc exp show` recipe, as a user copies it."""
    lines = (REPO / "README.md").read_text().splitlines()
    return shlex.split(next(ln for ln in lines if ln.startswith("dvc exp show ")), comments=True)


def width(shown: str) -> int:
    return max(len(line) for line in shown.splitlines())


@pytest.mark.slow
def test_seeds_then_compare_on_the_tiny_config(trained_project, tmp_path):
    """The README's order on the tiny pipeline: another seed (the trained one is at 7, then 8
    as an experiment: two seeds make a spread, and each more is one more whole pipeline), a
    kl_coef experiment with `--temp`, `rlhf compare`: the comparison has the seeds' spread
    and reads the experiment against it; the workspace's files stay as they were. The same
    change left in the workspace (`dvc exp apply`, as a run without `--temp` leaves it) is
    read against the same spread, and DVC's own views show it (`assert_dvc_views_show`)."""
    project = tmp_path / "p"
    shutil.copytree(trained_project, project, ignore=shutil.ignore_patterns("__pycache__"))
    sh(["git", "add", "-A"], project)
    sh(["git", "commit", "-qm", "seed 7"], project)
    rlhf = [sys.executable, "-m", "rlhf.cli"]
    done = subprocess.run(
        [*rlhf, "seeds", "8"], cwd=project, env=clean_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = sh(["dvc", "exp", "run", "--temp", "-n", "no-kl", "-S", "ppo.kl_coef=0.0"], project)
    assert stages_ran(ran) == {"rl@ppo", "evaluate"}  # an algorithm's params: it, and evaluate
    compared = json.loads(sh([*rlhf, "compare", "--json"], project))

    assert sorted(compared["seeds"]) == ["7", "8"]
    spread = compared["spread"]["eval/ppo:win"]
    assert spread["seeds"] == 2 and spread["std"] > 0 and spread["low"] < spread["high"]
    wins = [numbers["eval/ppo:win"] for numbers in compared["seeds"].values()]
    assert spread["mean"] == pytest.approx(sum(wins) / 2)
    experiment = compared["experiments"]["no-kl"]
    assert experiment["changes"] == ["ppo.kl_coef=0.0"]
    verdicts = {  # noise: within NOISE_STDS of the seeds' standard deviation from their mean
        key: abs(experiment["numbers"][key] - seeds["mean"]) <= NOISE_STDS * seeds["std"] + 1e-9
        for key, seeds in compared["spread"].items()
    }
    assert experiment["within_noise"] == verdicts
    assert sh(["git", "status", "--porcelain"], project) == ""  # the workspace as it was
    table = sh([*rlhf, "compare"], project)  # off a terminal: tab-separated rows
    header, *rows = [line.split("\t") for line in table.splitlines()]
    assert header[-1] == "no-kl (ppo.kl_coef=0.0)"
    marks = {row[0]: row[-1].split(" ")[-1] for row in rows}  # each experiment cell: "0.612 ~"
    assert marks == {key: "~" if within else "!" for key, within in verdicts.items()}

    # the same change left in the workspace: still read against HEAD's seeds, HEAD's
    # committed run the one at seed 7
    sh(["dvc", "exp", "apply", "no-kl"], project)
    again = json.loads(sh([*rlhf, "compare", "--json"], project))
    assert again["seeds"] == compared["seeds"] and again["spread"] == compared["spread"]
    assert again["experiments"]["workspace"]["changes"] == ["ppo.kl_coef=0.0"]
    assert again["experiments"]["workspace"]["numbers"] == experiment["numbers"]

    typo = subprocess.run([*rlhf, "seeds", "10", "-S", "ppo.klcoef=1"], cwd=project,
                          env=clean_env(), capture_output=True, text=True)  # fmt: skip
    assert typo.returncode == 2 and "did you mean ppo.kl_coef?" in typo.stderr
    assert_dvc_views_show(project)


def assert_dvc_views_show(project: Path) -> None:
    """DVC's views of the workspace's experiment show the headline numbers that moved, those
    of the policy whose params changed (its KL to SFT, and which of its win rates over the tiny
    config's 36 prompts change depends on the CPU's float rounding: the sampled one stayed at
    its 4 decimals on an Intel Xeon), in a 120-column terminal: `dvc metrics show` a row per
    file, and the README's `dvc exp show` recipe the changed param and the numbers it keeps,
    also once every metric differs (another CPU's run)."""
    diff = json.loads(sh(["dvc", "metrics", "diff", "--json"], project))
    assert set(diff) == {"metrics/eval/ppo.json"}  # SFT's, GRPO's, DPO's and the RM's stay
    moved = diff["metrics/eval/ppo.json"]
    assert "kl" in moved and {"win", "win_t", "win_greedy", "win_bon"} & moved.keys()

    table = sh(["dvc", "metrics", "show"], project, TERMINAL)
    assert width(table) <= 120, table
    assert table.splitlines()[0].split() == [
        "Path", "acc", "gold", "gold_greedy", "kl", "loss", "win", "win_bon", "win_greedy", "win_t"
    ]  # fmt: skip
    rows = [line.split()[0] for line in table.splitlines()[1:]]
    policies = [f"metrics/eval/{p}.json" for p in ("dpo", "grpo", "ppo", "sft")]
    assert sorted(rows) == sorted(["metrics/sft.json", "metrics/rm.json", "metrics/dpo.json",
                                   *policies])  # fmt: skip
    recipe = readme_exp_show()
    shown = sh([*recipe, "--no-pager"], project, TERMINAL)
    assert "…" not in shown and width(shown) <= 120, shown
    for column in ("ppo.kl_coef", "metrics/eval/ppo.json:win_t", "metrics/rm.json:acc"):
        assert column in shown

    for file in (project / "metrics").rglob("*.json"):  # another CPU: every number differs
        if "details" not in file.parts:
            numbers = json.loads(file.read_text())
            file.write_text(json.dumps({k: v + 0.01 for k, v in numbers.items()}))
    assert width(sh(["dvc", "metrics", "show"], project, TERMINAL)) <= 120
    shown = sh([*recipe, "--no-pager"], project, TERMINAL)
    assert "…" not in shown and width(shown) <= 120, shown
    assert "ppo.kl_coef" in shown
