"""What the committed default run shows: its metrics are this code's numbers, since CI checks
that the README's `dvc repro` reproduces them byte for byte."""

import math

import pytest

from rlhf.stages.support.metric_files import read_metrics

from conftest import REPO


def test_the_reward_model_beats_chance_on_held_out_comparisons():
    """The tiny test config's reward model is too small to learn (about chance): the default
    run shows that the reward model learns. Accuracy against the gold judge (over the pairs
    it decides, `pairs_by_margin`) and against the noisy labels (every held-out pair) each
    lie more than 4 standard errors above 1/2, the pairs taken as independent (pairs from one
    prompt's ranking are not quite: the margin leaves room for that)."""
    if not (REPO / "metrics" / "details" / "rm.json").is_file():
        pytest.skip("the default run's details are DVC outputs: `dvc pull` or `dvc repro`")
    metrics = read_metrics("rm", REPO)
    pairs = {
        "acc_gold": sum(metrics["pairs_by_margin"].values()),
        "acc_noisy": metrics["pairs_val"],
    }
    for key, n in pairs.items():
        accuracy = metrics[key]
        assert accuracy - 4 * math.sqrt(accuracy * (1 - accuracy) / n) > 0.5, (key, accuracy, n)
