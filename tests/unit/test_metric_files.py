"""What DVC's metrics views show: each stage's headline keys in metrics/NAME.json, the rest in
metrics/details/NAME.json, merged back exactly for the report."""

import json

from rlhf.eval.seeds import compared_numbers
from rlhf.stages import evaluate, rm
from rlhf.stages.support.metric_files import merged, read_metrics, split

EVALUATION = {
    "prompts": 40,
    "gold_sampled": {"sft": 0.5, "ppo": 0.6},
    "kl_to_sft": {"sft": 0.0, "ppo": 0.8},
    "win_rate": {
        "gold": {"ppo_vs_sft": 0.58, "dpo_vs_ppo": 0.49},
        "rm": {"ppo_vs_sft": 0.66},
    },
    "win_rate_ci95": {"gold": {"ppo_vs_sft": {"low": 0.55, "high": 0.61}}},
    "by_task": {"ppo": {"add": {"gold_sampled": 0.3}}},
}


def test_headline_keys_go_to_the_metrics_file_and_the_rest_to_details():
    shown, details = split(EVALUATION, evaluate.SPEC.headline)
    assert shown == {
        "gold_sampled": {"sft": 0.5, "ppo": 0.6},
        "kl_to_sft": {"sft": 0.0, "ppo": 0.8},
        "win_rate": {"gold": {"ppo_vs_sft": 0.58}},  # over SFT only: one column per policy
    }
    assert details["win_rate"] == {"gold": {"dpo_vs_ppo": 0.49}, "rm": {"ppo_vs_sft": 0.66}}
    assert "gold_sampled" not in details and details["prompts"] == 40
    assert merged(shown, details) == EVALUATION


def test_a_headline_key_a_run_did_not_measure_is_left_out():
    shown, details = split({"kl_to_sft": {"ppo": 0.8}, "prompts": 4}, evaluate.SPEC.headline)
    assert shown == {"kl_to_sft": {"ppo": 0.8}} and details == {"prompts": 4}


def test_reading_merges_both_files_and_takes_either_alone(tmp_path):
    (tmp_path / "metrics" / "details").mkdir(parents=True)
    shown, details = split(EVALUATION, evaluate.SPEC.headline)
    (tmp_path / "metrics" / "eval.json").write_text(json.dumps(shown))
    (tmp_path / "metrics" / "details" / "eval.json").write_text(json.dumps(details))
    assert read_metrics("eval", tmp_path) == EVALUATION
    (tmp_path / "metrics" / "details" / "ppo.json").write_text('{"score": 0.2}')
    assert read_metrics("ppo", tmp_path) == {"score": 0.2}  # an RL stage's are all details


def test_rlhf_compare_compares_headline_numbers_only():
    """`rlhf compare` reads recorded runs from git, where only the headline files are."""
    full = {"eval": EVALUATION, "rm": {"acc_gold": 0.8, "acc_gold_by_task": {"add": 0.6}}}
    headline = {
        "eval": split(EVALUATION, evaluate.SPEC.headline)[0],
        "rm": split(full["rm"], rm.SPEC.headline)[0],
    }
    assert compared_numbers(headline) == compared_numbers(full)
    assert set(compared_numbers(full)) == {
        "eval:gold_sampled.sft", "eval:gold_sampled.ppo", "eval:kl_to_sft.sft",
        "eval:kl_to_sft.ppo", "eval:win_rate.gold.ppo_vs_sft", "rm:acc_gold",
    }  # fmt: skip


def test_off_the_task_suite_the_reward_models_win_rates_are_headline():
    """Without a gold judge (your own data) the headline win rates are the reward model's;
    an empty breakdown the stage wrote stays in the details as written."""
    measured = {
        "win_rate": {"rm": {"ppo_vs_sft": 0.6, "dpo_vs_ppo": 0.5}, "hf:judge": {"ppo_vs_sft": 0.7}},
        "kl_to_sft": {"ppo": 1.0},
        "by_task": {},
    }
    shown, details = split(measured, evaluate.SPEC.headline)
    assert shown == {"win_rate": {"rm": {"ppo_vs_sft": 0.6}}, "kl_to_sft": {"ppo": 1.0}}
    assert details["by_task"] == {} and details["win_rate"]["hf:judge"] == {"ppo_vs_sft": 0.7}
    assert merged(shown, details) == measured
