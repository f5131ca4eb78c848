"""What the committed default run shows: its metrics are this code's numbers, since CI checks
that the README's `dvc repro` reproduces them byte for byte, and the results pages state them.

Its details (`metrics/details/`) are DVC outputs, not in git: on a fresh clone these tests
skip until `dvc repro` (or `dvc pull` from the remote) brings them, so that `pytest
tests/unit` passes there before any run."""

import hashlib
import math
import subprocess
import sys

import pytest
import yaml

from rlhf.project import paths
from rlhf.project.metric_files import read_metrics

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


def locked_md5(path: str) -> str | None:
    """The md5 dvc.lock records for output `path` (DVC's hash of its bytes)."""
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())
    for stage in lock["stages"].values():
        for out in stage.get("outs", []):
            if out["path"] == path:
                return out["md5"]
    return None


def test_the_results_pages_are_generated_from_the_committed_run():
    """README.md's and docs/results.md's results: a new `dvc repro` that moves a number fails
    here until `python docs/results.py` regenerates them. Skipped where the details are
    another run's than dvc.lock's: on another CPU family, after CI's `.ci/outputs.py check`
    compared that run with the seed spread and restored the files git holds, but not the
    DVC outputs (a clean clone has no cache of the committed ones)."""
    for path in DETAILS:
        md5 = hashlib.md5(path.read_bytes()).hexdigest()
        if md5 != locked_md5(str(path.relative_to(REPO))):
            pytest.skip(f"{path.relative_to(REPO)} is not the committed run's (dvc.lock)")
    result = subprocess.run(
        [sys.executable, "docs/results.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
