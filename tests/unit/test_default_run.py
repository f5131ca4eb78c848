"""What the committed default run shows: its metrics are this code's numbers, since CI checks
that the README's `dvc repro` reproduces them byte for byte, and the results pages state them.

Its details (`metrics/details/`) are DVC outputs, not in git: on a fresh clone these tests
skip until `dvc repro` (or `dvc pull` from the remote) brings them, so that `pytest
tests/unit` passes there before any run."""

import math
import subprocess
import sys

import pytest

from rlhf.stages.support import paths
from rlhf.stages.support.metric_files import read_metrics

from conftest import REPO

DETAILS = [REPO / paths.details_file(stage) for stage in ("eval", "rm")]  # what these read
pytestmark = pytest.mark.skipif(
    not all(path.is_file() for path in DETAILS),
    reason="the default run's details are DVC outputs: `dvc pull` or `dvc repro`",
)


def test_the_reward_model_beats_chance_on_held_out_comparisons():
    """The tiny test config's reward model is too small to show learning on held-out
    comparisons (tests/stages/test_rm_stage.py): the default run shows it. Accuracy against
    the gold judge (over the pairs it decides, `pairs_by_margin`) and against the noisy labels
    (every held-out pair) each lie more than 4 standard errors above 1/2, the pairs taken as
    independent (pairs from one prompt's ranking are not quite: the margin leaves room for
    that)."""
    metrics = read_metrics("rm", REPO)
    pairs = {
        "acc_gold": sum(metrics["pairs_by_margin"].values()),
        "acc_noisy": metrics["pairs_val"],
    }
    for key, n in pairs.items():
        accuracy = metrics[key]
        assert accuracy - 4 * math.sqrt(accuracy * (1 - accuracy) / n) > 0.5, (key, accuracy, n)


def test_the_results_pages_are_generated_from_the_committed_run():
    """README.md's and docs/results.md's results: a new `dvc repro` that moves a number fails
    here until `python docs/results.py` regenerates them."""
    result = subprocess.run(
        [sys.executable, "docs/results.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
