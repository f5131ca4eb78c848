"""Seed-to-seed spread: `rlhf seeds` runs the pipeline at several seeds as DVC experiments and
`rlhf compare` reads every experiment's numbers against that spread."""

import json
import shutil
import subprocess
import sys

import pytest

from rlhf.eval.seeds import Spread, compared_numbers, params_changed, spreads

from conftest import clean_env, sh


def test_a_spread_is_the_seeds_mean_and_sample_deviation_and_flags_what_leaves_it():
    (spread,) = spreads([{"k": 0.50}, {"k": 0.54}, {"k": 0.58}]).values()
    assert spread == Spread(
        mean=pytest.approx(0.54), std=pytest.approx(0.04), low=0.50, high=0.58, seeds=3
    )
    assert spread.within_noise(0.61) and not spread.within_noise(0.63)  # 2 std: 0.46 to 0.62
    assert spreads([{"k": 1.0, "only_here": 2.0}, {"k": 3.0}]).keys() == {"k"}


def test_the_compared_numbers_are_the_headline_ones_named_by_file():
    metrics = {
        "eval": {"win_rate": {"gold": {"ppo_vs_sft": 0.6}, "rm": {"ppo_vs_sft": 0.7}},
                 "kl_to_sft": {"ppo": 1.1}, "by_task": {"ppo": {"add": {"kl_to_sft": 2.0}}}},
        "rm": {"acc_gold": 0.8, "acc_gold_by_task": {"add": 0.6}},
    }  # fmt: skip
    assert compared_numbers(metrics) == {
        "eval:win_rate.gold.ppo_vs_sft": 0.6, "eval:kl_to_sft.ppo": 1.1, "rm:acc_gold": 0.8,
    }  # fmt: skip
    assert params_changed({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == ["b=2", "c=None"]


@pytest.mark.slow
def test_seeds_then_compare_on_the_tiny_config(trained_project, tmp_path):
    """Three seeds of the tiny pipeline (the trained one at 7, then 8 and 9 as experiments)
    and a kl_coef experiment: the comparison has the three seeds' spread and reads the
    experiment against it; the workspace's files stay as they were."""
    project = tmp_path / "p"
    shutil.copytree(trained_project, project, ignore=shutil.ignore_patterns("__pycache__"))
    sh(["git", "add", "-A"], project)
    sh(["git", "commit", "-qm", "seed 7"], project)
    rlhf = [sys.executable, "-m", "rlhf.cli"]
    done = subprocess.run(
        [*rlhf, "seeds", "8", "9"], cwd=project, env=clean_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    sh(["dvc", "exp", "run", "--temp", "-n", "strong-kl", "-S", "ppo.kl_coef=0.5"], project)
    compared = json.loads(sh([*rlhf, "compare", "--json"], project))

    assert sorted(compared["seeds"]) == ["7", "8", "9"]
    spread = compared["spread"]["eval:win_rate.gold.ppo_vs_sft"]
    assert spread["seeds"] == 3 and spread["std"] > 0 and spread["low"] < spread["high"]
    wins = [numbers["eval:win_rate.gold.ppo_vs_sft"] for numbers in compared["seeds"].values()]
    assert spread["mean"] == pytest.approx(sum(wins) / 3)
    experiment = compared["experiments"]["strong-kl"]
    assert experiment["changes"] == ["ppo.kl_coef=0.5"]
    assert experiment["within_noise"].keys() == compared["spread"].keys()
    assert sh(["git", "status", "--porcelain"], project) == ""  # the workspace as it was
    table = sh([*rlhf, "compare"], project)  # off a terminal: tab-separated rows
    assert "eval:win_rate.gold.ppo_vs_sft\t" in table and "strong-kl (ppo.kl_coef=0.5)" in table

    typo = subprocess.run([*rlhf, "seeds", "10", "-S", "ppo.klcoef=1"], cwd=project,
                          env=clean_env(), capture_output=True, text=True)  # fmt: skip
    assert typo.returncode == 2 and "did you mean ppo.kl_coef?" in typo.stderr
