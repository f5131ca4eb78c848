"""What DVC's metrics views show: each stage's headline numbers under short keys in
metrics/NAME.json (evaluate: one file per policy), everything it measured, those included, in
metrics/details/NAME.json for the report."""

import json

from rlhf.atomic import publication
from rlhf.eval.seeds import compared_files, compared_numbers
from rlhf.project.metric_files import headline_view, read_metrics
from rlhf.stages import evaluate, rm
from rlhf.stages.support.outputs import write_metrics

from conftest import REPO, clean_env, sh

EVALUATION = {
    "prompts": 40,
    "gold_sampled": {"sft": 0.5, "ppo": 0.6},
    "gold_greedy": {"sft": 0.8, "ppo": 0.7},
    "kl_to_sft": {"sft": 0.0, "ppo": 0.8},
    "win_rate": {
        "gold": {"ppo_vs_sft": 0.58, "dpo_vs_ppo": 0.49},
        "rm": {"ppo_vs_sft": 0.66},
    },
    "win_rate_ci95": {"gold": {"ppo_vs_sft": {"low": 0.55, "high": 0.61}}},
    "by_task": {"ppo": {"add": {"gold_sampled": 0.3}}},
}


def ppo_view(measured):
    return headline_view(measured, evaluate.SPEC.headline, policy="ppo")


def test_a_policys_headline_numbers_go_under_short_keys():
    assert ppo_view(EVALUATION) == {"win": 0.58, "gold": 0.6, "gold_greedy": 0.7, "kl": 0.8}
    sft = headline_view(EVALUATION, evaluate.SPEC.headline, policy="sft")
    assert sft == {"gold": 0.5, "gold_greedy": 0.8, "kl": 0.0}  # no win rate over itself


def test_off_the_task_suite_the_reward_models_win_rates_are_headline():
    """Without a gold judge (your own data) `win` is the reward model's; without gold scores
    the reward model's accuracy is on the pairs' own labels."""
    measured = {"win_rate": {"rm": {"ppo_vs_sft": 0.6}, "hf:judge": {"ppo_vs_sft": 0.7}}}
    assert ppo_view(measured) == {"win": 0.6}
    assert headline_view({"acc_gold": None, "acc_noisy": 0.7}, rm.SPEC.headline) == {"acc": 0.7}
    trained = {"acc_gold": 0.8, "acc_noisy": 0.6, "val_loss": 0.5, "steps": 9}
    assert headline_view(trained, rm.SPEC.headline) == {"acc": 0.8, "loss": 0.5}


def test_evaluate_writes_everything_to_details_and_a_headline_file_per_policy(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "metrics" / "details").mkdir(parents=True)
    with publication() as out:
        write_metrics(out, evaluate.SPEC, EVALUATION, policies=["sft", "ppo"])
    assert read_metrics("eval", tmp_path) == EVALUATION  # headline numbers included
    written = {f.name: json.loads(f.read_text()) for f in (tmp_path / "metrics/eval").iterdir()}
    assert written == {"sft.json": headline_view(EVALUATION, evaluate.SPEC.headline, policy="sft"),
                       "ppo.json": ppo_view(EVALUATION)}  # fmt: skip


def test_rlhf_compare_reads_each_policys_file_and_the_reward_models():
    """`rlhf compare` reads recorded runs from git, where only the headline files are."""
    assert compared_files(["ppo"]) == ["eval/sft", "eval/ppo", "eval/dpo", "rm"]
    files = {"eval/sft": {"gold": 0.5, "kl": 0.0}, "eval/ppo": ppo_view(EVALUATION)}
    files["rm"] = {"acc": 0.8, "loss": 0.5}
    assert compared_numbers(files) == {
        "eval/sft:gold": 0.5, "eval/sft:kl": 0.0, "eval/ppo:win": 0.58, "eval/ppo:gold": 0.6,
        "eval/ppo:gold_greedy": 0.7, "eval/ppo:kl": 0.8, "rm:acc": 0.8,
    }  # fmt: skip


def test_the_default_runs_dvc_metrics_show_fits_a_120_column_terminal():
    """The committed run's headline numbers, as the README's `dvc metrics show` prints them: a
    row per file, a column per short key."""
    shown = sh(["dvc", "metrics", "show"], REPO, clean_env() | {"COLUMNS": "120"})
    assert max(len(line) for line in shown.splitlines()) <= 120, shown
    rows = [line.split()[0] for line in shown.splitlines()[1:]]
    policies = [f"metrics/eval/{p}.json" for p in ("sft", "ppo", "grpo", "dpo")]  # the default's
    assert sorted(rows) == sorted(
        ["metrics/sft.json", "metrics/rm.json", "metrics/dpo.json", *policies]
    )
