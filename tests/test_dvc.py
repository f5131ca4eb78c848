import json
import re
import subprocess

import pytest
import yaml

from conftest import clean_env, init_dvc_repo, make_project, write_params


def sh(args, cwd):
    return subprocess.run(
        args, cwd=cwd, env=clean_env(), capture_output=True, text=True, check=True
    )


def repro(project) -> set[str]:
    """Stages that actually ran, from DVC's own log."""
    out = sh(["dvc", "repro"], project).stdout
    return set(re.findall(r"Running stage '([\w-]+)'", out))


@pytest.fixture(scope="module")
def dvc_project(tmp_path_factory):
    return init_dvc_repo(make_project(tmp_path_factory.mktemp("dvc")))


def test_first_repro_runs_every_stage(dvc_project):
    assert repro(dvc_project) == {
        "prepare", "tokenizer", "sft", "collect", "rm", "ppo", "dpo", "evaluate",
    }  # fmt: skip
    assert (dvc_project / "artifacts" / "sft" / "model.pt").exists()
    assert (dvc_project / "reports" / "eval.md").exists()
    shown = sh(["dvc", "metrics", "show", "--json"], dvc_project).stdout
    assert "gold_greedy" in shown and "win_rate" in shown


def test_second_repro_does_no_work(dvc_project):
    assert repro(dvc_project) == set()


def test_experiment_with_another_kl_coef_shows_changed_win_rates(dvc_project):
    sh(["git", "add", "-A"], dvc_project)
    sh(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"], dvc_project)
    out = sh(["dvc", "exp", "run", "-S", "ppo.kl_coef=0.0"], dvc_project).stdout
    assert set(re.findall(r"Running stage '([\w-]+)'", out)) == {"ppo", "evaluate"}
    diff = json.loads(sh(["dvc", "metrics", "diff", "--json"], dvc_project).stdout)
    changed = diff["metrics/eval.json"]
    assert "win_rate.ppo_vs_sft" in changed and "kl_to_sft.ppo" in changed
    rate = changed["win_rate.ppo_vs_sft"]
    assert rate["old"] != rate["new"]
    assert "gold_sampled.sft" not in changed  # SFT was not retrained: its numbers stand


def test_changing_rm_lr_reruns_rm_but_not_sft_or_collect(dvc_project):
    write_params(dvc_project, {"rm.lr": 0.003})
    assert repro(dvc_project) == {"rm", "ppo", "evaluate"}


def test_changing_kl_coef_reruns_ppo_only(dvc_project):
    write_params(dvc_project, {"rm.lr": 0.003, "ppo.kl_coef": 0.3})
    assert repro(dvc_project) == {"ppo", "evaluate"}


def test_changing_evaluate_params_reruns_evaluate_only(dvc_project):
    write_params(dvc_project, {"rm.lr": 0.003, "ppo.kl_coef": 0.3, "evaluate.samples": 2})
    assert repro(dvc_project) == {"evaluate"}


def test_changing_dpo_beta_reruns_dpo_and_evaluate_only(dvc_project):
    write_params(dvc_project, {"rm.lr": 0.003, "ppo.kl_coef": 0.3, "dpo.beta": 0.2})
    assert repro(dvc_project) == {"dpo", "evaluate"}


def test_changing_sft_lr_reruns_sft_and_downstream(dvc_project):
    write_params(dvc_project, {"rm.lr": 0.003, "ppo.kl_coef": 0.3, "sft.lr": 0.02})
    assert repro(dvc_project) == {"sft", "collect", "rm", "ppo", "dpo", "evaluate"}


def test_changing_tokenizer_reruns_it_and_downstream(dvc_project):
    write_params(
        dvc_project,
        {"rm.lr": 0.003, "ppo.kl_coef": 0.3, "sft.lr": 0.02, "tokenizer.vocab_size": 350},
    )
    assert repro(dvc_project) == {"tokenizer", "sft", "collect", "rm", "ppo", "dpo", "evaluate"}


def test_stages_declare_exactly_their_param_groups():
    from conftest import REPO

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert stages["prepare"]["params"] == ["seed", "data"]
    assert stages["tokenizer"]["params"] == ["tokenizer"]
    assert stages["sft"]["params"] == ["seed", "device", "model", "sft"]
    assert stages["collect"]["params"] == ["seed", "device", "collect"]
    assert stages["rm"]["params"] == ["seed", "device", "rm"]
    assert stages["ppo"]["params"] == ["seed", "device", "ppo"]
    assert stages["dpo"]["params"] == ["seed", "device", "dpo"]
    assert stages["evaluate"]["params"] == ["seed", "device", "evaluate"]
    assert "artifacts/dpo/model.pt" in stages["evaluate"]["deps"]
    assert {"artifacts/sft/model.pt", "artifacts/rm/model.pt"} <= set(stages["ppo"]["deps"])
    assert not any(".rlhf" in str(out) for s in stages.values() for out in s.get("outs", []))


def test_params_file_is_validated_before_any_work(tmp_path):
    project = make_project(tmp_path / "p")
    write_params(project, {"sft.lrr": 0.1})
    result = subprocess.run(
        ["rlhf", "prepare"], cwd=project, env=clean_env(), capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "unknown key 'sft.lrr'" in result.stderr and "did you mean 'sft.lr'" in result.stderr
    assert not (project / "data" / "prepared").exists()
