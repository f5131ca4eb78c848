"""A canary's verdict: a run's headline numbers against a committed baseline's seed spread."""

import json

import pytest

from rlhf.eval.seeds import Spread, read_against
from rlhf.project.drift import BaselineError, Drift, read_baseline

from conftest import REPO

SPREAD = {
    "eval/ppo:win": Spread(mean=0.54, std=0.04, low=0.50, high=0.58, seeds=3),
    "rm:acc": Spread(mean=0.80, std=0.0, low=0.80, high=0.80, seeds=3),
}


def test_a_number_drifts_when_it_leaves_mean_plus_minus_the_tolerance_in_stds():
    """At 2 std the win rate's band is 0.46 – 0.62; a std of 0 counts as 0.02 (three seeds
    that agree are not a promise of the last digit): 0.76 – 0.84."""
    within = Drift("base.json", read_against({"eval/ppo:win": 0.61, "rm:acc": 0.815}, SPREAD, 2))
    assert within.failures == []
    assert within.reason() == "within 2 std of the baseline base.json on every number"
    drifted = Drift("base.json", read_against({"eval/ppo:win": 0.63}, SPREAD, 2))
    assert drifted.failures == [
        "eval/ppo:win: 0.6300 outside 0.4600 – 0.6200",
        "rm:acc: missing from this run's metrics",
    ]
    assert drifted.reason() == (
        "drifted from the baseline base.json (2 std): eval/ppo:win: 0.6300 outside 0.4600 – "
        "0.6200; rm:acc: missing from this run's metrics"
    )
    assert drifted.rows() == [
        {"number": "eval/ppo:win", "baseline": "0.5400 ± 0.0400 (3 seeds)",
         "this run": "0.6300", "verdict": "drift"},
        {"number": "rm:acc", "baseline": "0.8000 ± 0.0000 (3 seeds)", "this run": "–",
         "verdict": "drift"},
    ]  # fmt: skip
    wider = Drift("base.json", read_against({"eval/ppo:win": 0.63, "rm:acc": 0.8}, SPREAD, 4))
    assert wider.failures == []  # 4 std: 0.38 – 0.70


def test_the_committed_seed_spread_is_a_baseline():
    spread = read_baseline(REPO / "docs" / "seeds.json")
    assert "eval/ppo:win_t" in spread and "rm:acc" in spread
    assert all(s.seeds == 3 for s in spread.values())


@pytest.mark.parametrize(
    ("contents", "message"),
    [
        (None, r"base.json: no such baseline file: write one with `rlhf compare --json >"),
        ("{not json", r"base.json: not JSON \("),
        (json.dumps({"seeds": {}}), r"base.json: key 'spread': missing or empty"),
        (json.dumps({"spread": {"rm:acc": {"mean": 0.8}}}),
         r"base.json: key 'spread.rm:acc': must hold the numbers mean, std, low, high, seeds"),
        (json.dumps({"spread": {"rm:acc": {"mean": 0.8, "std": -1, "low": 0, "high": 1,
                                           "seeds": 2}}}), r"\(std at least 0\)"),
        (json.dumps([1, 2]), r"key 'spread': missing"),
    ],
)  # fmt: skip
def test_a_baseline_that_is_not_compare_output_is_one_line_naming_the_file_and_key(
    tmp_path, contents, message
):
    path = tmp_path / "base.json"
    if contents is not None:
        path.write_text(contents)
    with pytest.raises(BaselineError, match=message):
        read_baseline(path)
