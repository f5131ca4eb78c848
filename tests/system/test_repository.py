"""The git and DVC around a scheduled run (rlhf/flows/repository.py), on a one-stage project."""

from __future__ import annotations

from rlhf.flows.repository import checkout_for_run, head_commit, record_experiment

from conftest import init_dvc_repo, sh

STAGE = """stages:
  count:
    cmd: >-
      mkdir -p out && echo 1 > out/model.txt && echo '{"n": 1}' > metrics.json
    outs: [out/model.txt]
    metrics: [{metrics.json: {cache: false}}]
"""


def test_an_experiment_keeps_what_git_needs_to_ignore_the_outputs_it_checks_out(tmp_path):
    """A first run writes outputs in a new folder, where DVC writes a `.gitignore` for them:
    the experiment keeps it, so that `dvc exp apply` leaves no model for `git add`."""
    root = init_dvc_repo(tmp_path)
    (root / "dvc.yaml").write_text(STAGE)
    sh(["git", "add", "-A"], root)
    sh(["git", "commit", "-qm", "one stage"], root)
    checkout = checkout_for_run(root, "first", head_commit(root))
    sh(["dvc", "repro"], checkout)
    (checkout / "core").write_text("a stray file")

    commit = record_experiment(checkout, "first", root)

    kept = sh(["git", "ls-tree", "-r", "--name-only", commit], root).split()
    assert {"out/.gitignore", "metrics.json", "dvc.lock"} <= set(kept)
    assert "core" not in kept  # what no stage declared stays out
    sh(["dvc", "exp", "apply", "first"], root)
    assert (root / "out" / "model.txt").read_text() == "1\n"
    status = sh(["git", "status", "--porcelain", "--untracked-files=all"], root).splitlines()
    assert sorted(status) == ["?? dvc.lock", "?? metrics.json", "?? out/.gitignore"]  # no model
