"""The DVC pipeline: generated from the stage declarations, exact code deps, and real `dvc repro`
runs on the tiny config that rerun exactly the stages whose params, data or code changed."""

import copy
import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlhf import dvcfile
from rlhf.project.imports import code_closure
from rlhf.project.metric_files import read_metrics

from conftest import (
    FIRST_REPRO_LOG,
    REPO,
    clean_env,
    make_project,
    sh,
    shared_project,
    stages_ran,
    write_params,
)


def repro(project, *options: str) -> set[str]:
    """Stages that actually ran, from DVC's own log."""
    return stages_ran(sh(["dvc", "repro", *options], project))


def stage_definitions(dvc_yaml: dict) -> dict[str, dict]:
    """Each stage's definition; a foreach stage's `do` template stands for all its elements."""
    return {name: s.get("do", s) for name, s in dvc_yaml["stages"].items()}


def missing_code_deps(dvc_yaml: dict) -> dict[str, list[str]]:
    """Per stage, the project modules its command imports (transitively) that its deps omit."""
    missing = {}
    for name, stage in stage_definitions(dvc_yaml).items():
        module = re.match(r"python -m ([\w.]+)", stage["cmd"]).group(1)
        deps = set(stage["deps"])
        absent = [str(p) for p in code_closure(module, REPO) if str(p) not in deps]
        if absent:
            missing[name] = absent
    return missing


def shipped_dvc_yaml() -> dict:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())


def test_dvc_yaml_is_what_the_stage_declarations_generate():
    assert (REPO / "dvc.yaml").read_text() == dvcfile.render(REPO), "run `rlhf dvc-yaml`"


def test_every_stage_lists_every_project_module_it_imports():
    assert missing_code_deps(shipped_dvc_yaml()) == {}


def test_dropping_any_one_module_from_a_stages_deps_is_caught():
    """The check above is not vacuous: each code dep of each stage, left out alone, fails it."""
    shipped = shipped_dvc_yaml()
    for name, stage in stage_definitions(shipped).items():
        for dep in [d for d in stage["deps"] if d.startswith("rlhf/")]:
            trimmed = copy.deepcopy(shipped)
            definition = stage_definitions(trimmed)[name]
            definition["deps"].remove(dep)
            assert missing_code_deps(trimmed) == {name: [dep]}, (name, dep)


def test_the_chat_template_reaches_every_stage_that_encodes_or_samples():
    """What the review found stale: the chat template is imported indirectly by sft, collect,
    rm, rl, dpo and evaluate, and directly by none of them."""
    users = {
        name
        for name, stage in stage_definitions(shipped_dvc_yaml()).items()
        if "rlhf/tokenizer/chat.py" in stage["deps"]
    }
    assert users == {"sft", "collect", "rm", "rl", "dpo", "evaluate"}


@pytest.fixture(scope="module")
def dvc_project(trained_project, tmp_path_factory):
    """A copy of the project the first `dvc repro` trained (conftest), with its git
    repository, dvc.lock and DVC cache."""
    project = tmp_path_factory.mktemp("dvc") / "project"
    shutil.copytree(trained_project, project, ignore=shutil.ignore_patterns("__pycache__"))
    return project


ALL_STAGES = {
    "prepare", "tokenizer", "sft", "collect", "rm", "rl@ppo", "rl@grpo", "dpo", "evaluate",
}  # fmt: skip


def test_first_repro_runs_every_stage(dvc_project):
    first = (dvc_project / FIRST_REPRO_LOG).read_text()
    assert stages_ran(first) == ALL_STAGES
    assert (dvc_project / "artifacts" / "sft" / "model.pt").exists()
    assert (dvc_project / "artifacts" / "grpo" / "model.pt").exists()
    assert (dvc_project / "reports" / "eval.md").exists()
    shown = sh(["dvc", "metrics", "show", "--json"], dvc_project)
    assert '"gold_greedy"' in shown and '"win"' in shown and "metrics/eval/grpo.json" in shown


def test_second_repro_does_no_work(dvc_project):
    assert repro(dvc_project) == set()


def stale_stages(project) -> set[str]:
    return set(json.loads(sh(["dvc", "status", "--json"], project)))


def test_changing_an_indirectly_imported_module_makes_every_stage_that_runs_it_stale(
    dvc_project,
):
    template = dvc_project / "rlhf" / "tokenizer" / "chat.py"
    original = template.read_text()
    template.write_text(original + "\n# the template changed\n")
    try:
        stale = stale_stages(dvc_project)
    finally:
        template.write_text(original)
    assert stale == {"sft", "collect", "rm", "rl@ppo", "rl@grpo", "dpo", "evaluate"}
    assert stale_stages(dvc_project) == set()


def dry_repro(project, overrides: dict) -> set[str]:
    """The stages `dvc repro` would run with these params, forcing what follows a stage that
    runs (as it reruns once that stage's outputs change); params.yaml is left as it was. The
    rloo test reruns stages for real."""
    before = (project / "params.yaml").read_text()
    write_params(project, overrides)
    try:
        out = sh(["dvc", "repro", "--dry", "--force-downstream"], project)
    finally:
        (project / "params.yaml").write_text(before)
    return stages_ran(out)


def test_changing_rm_lr_reruns_rm_and_every_rl_stage_but_not_sft_or_collect(dvc_project):
    assert dry_repro(dvc_project, {"rm.lr": 0.003}) == {"rm", "rl@ppo", "rl@grpo", "evaluate"}


def test_changing_what_rl_algorithms_share_reruns_them_all(dvc_project):
    changed = {"rl.length_penalty": 0.01}
    assert dry_repro(dvc_project, changed) == {"rl@ppo", "rl@grpo", "evaluate"}


ADDED_RLOO = {
    "rl_algorithms": ["ppo", "grpo", "rloo"],
    "rloo": {"steps": 4, "batch_size": 4, "group_size": 2, "minibatch_size": 4},
}


def test_adding_an_algorithm_runs_its_stage_and_the_evaluation_only(dvc_project, tmp_path):
    """On a copy of the project: the other tests find it as trained, in any order."""
    project = tmp_path / "project"
    shutil.copytree(dvc_project, project)
    write_params(project, ADDED_RLOO)
    assert repro(project) == {"rl@rloo", "evaluate"}
    metrics = read_metrics("eval", project)
    assert {"rloo_vs_sft", "dpo_vs_rloo"} <= set(metrics["win_rate"]["gold"])


def test_changing_evaluate_params_reruns_evaluate_only(dvc_project):
    """`dvc status` rather than a rerun: evaluate has nothing downstream, so the stages it
    lists are the ones `dvc repro` would run."""
    before = (dvc_project / "params.yaml").read_text()
    write_params(dvc_project, {"evaluate.samples": 2})
    try:
        assert stale_stages(dvc_project) == {"evaluate"}
    finally:
        (dvc_project / "params.yaml").write_text(before)


def test_changing_dpo_beta_reruns_dpo_and_evaluate_only(dvc_project):
    assert dry_repro(dvc_project, {"dpo.beta": 0.2}) == {"dpo", "evaluate"}


def test_changing_sft_lr_reruns_sft_and_downstream(dvc_project):
    ran = dry_repro(dvc_project, {"sft.lr": 0.02})
    assert ran == ALL_STAGES - {"prepare", "tokenizer"}


def test_params_file_is_validated_before_any_work(tmp_path):
    project = make_project(tmp_path / "p")
    write_params(project, {"sft.lrr": 0.1})
    result = subprocess.run(
        ["rlhf", "prepare"], cwd=project, env=clean_env(), capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "unknown key 'sft.lrr'" in result.stderr and "did you mean 'sft.lr'" in result.stderr
    assert not (project / "data" / "prepared").exists()


def test_a_clone_pulls_every_output_from_the_default_remote(trained_project, tmp_path):
    """The repository ships a local directory remote beside it: `git clone && dvc pull`
    gives a second copy every output of the run, byte for byte, and DVC calls it up to date."""
    config = (REPO / ".dvc" / "config").read_text()  # paths as written, relative to .dvc/
    assert "remote = storage" in config and "url = ../../rlhf-pipeline-storage" in config
    upstream = shared_project(trained_project, tmp_path / "upstream")
    assert (tmp_path / "rlhf-pipeline-storage" / "files" / "md5").is_dir()
    sh(["git", "clone", "-q", str(upstream), "clone"], tmp_path)
    clone = tmp_path / "clone"
    assert not (clone / "artifacts" / "sft" / "model.pt").exists()
    sh(["dvc", "pull", "-q"], clone)
    for model in ("sft", "rm", "ppo", "dpo"):
        relative = Path("artifacts") / model / "model.pt"
        assert (clone / relative).read_bytes() == (upstream / relative).read_bytes()
    assert "up to date" in sh(["dvc", "status"], clone)


def test_at_the_same_threads_a_stage_writes_the_same_bytes_on_one_core_as_on_two(
    trained_project, tmp_path
):
    """`threads` decides torch's CPU threads (and so the order floats are summed in), not
    OMP_NUM_THREADS nor the cores the process may use: at `threads: 2` the reward model
    trained on one core is the one trained on two, byte for byte; the timings say 2."""
    outputs = []
    for cores, omp in (({0}, "1"), (os.sched_getaffinity(0), "2")):
        project = tmp_path / f"on-{len(cores)}"
        shutil.copytree(trained_project, project, ignore=shutil.ignore_patterns("__pycache__"))
        write_params(project, {"threads": 2})
        done = subprocess.run(
            [sys.executable, "-m", "rlhf.stages.rm"], cwd=project,
            env=clean_env() | {"OMP_NUM_THREADS": omp},
            preexec_fn=lambda cores=cores: os.sched_setaffinity(0, cores),
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads((project / "timings" / "rm.json").read_text())["threads"] == 2
        written = ("artifacts/rm/model.pt", "metrics/details/rm.json")
        outputs.append([(project / f).read_bytes() for f in written])
    assert outputs[0] == outputs[1]


def test_every_plot_is_titled_and_draws_what_varies(dvc_project):
    """`dvc plots show` draws dvc.yaml's top-level plots alone, each under its title, from
    files the run wrote, without an error; no stage declares a plot of its own (it would be
    drawn again, untitled, file by file). A drawn curve of more than one point varies: the
    constants a stage logs (RL's learning rate, KL coefficient, update passes) are not drawn."""
    declared = yaml.safe_load((dvc_project / "dvc.yaml").read_text())
    assert not [name for name, stage in stage_definitions(declared).items() if "plots" in stage]
    shown = json.loads(sh(["dvc", "plots", "show", "--json"], dvc_project))
    assert "errors" not in shown
    titles = [title for plot in declared["plots"] for title in plot]
    assert list(shown["data"]) == titles and len(titles) == 21
    drawn = {file for plot in declared["plots"] for spec in plot.values() for file in spec["y"]}
    assert "dvclive/grpo/plots/metrics/score.tsv" in drawn
    for plot in declared["plots"]:
        for file, column in next(iter(plot.values()))["y"].items():
            with (dvc_project / file).open() as handle:
                delimiter = "\t" if file.endswith(".tsv") else ","
                values = [row[column] for row in csv.DictReader(handle, delimiter=delimiter)]
            assert len(values) < 2 or len(set(values)) > 1, file
    for constant in ("lr", "beta", "update_epochs_run"):
        assert f"dvclive/ppo/plots/metrics/{constant}.tsv" not in drawn
