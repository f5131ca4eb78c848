"""The Prefect flows against a real temporary Prefect server and real DVC, on the tiny config."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import yaml

# GPU hosts run the suite without Prefect (benchmarks/gpu.sh): these tests are skipped there
pytest.importorskip("prefect")

from prefect import get_client
from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.deployments import run_deployment
from prefect.logging.handlers import APILogHandler
from prefect.workers.process import ProcessWorker
from typer.testing import CliRunner

from rlhf.cli import app
from rlhf.dvcfile import declared_stages
from rlhf.eval.seeds import compared_numbers
from rlhf.flows.dispatch import run_stage_deployment
from rlhf.flows.lock import HOLDING, RELEASED
from rlhf.flows.pipeline import DRIFTED, REFUSED, SKIPPED, pipeline, stage_flow
from rlhf.flows.stage_names import stage_names
from rlhf.params.groups import RL_ALGORITHMS
from rlhf.project.experiments import read_run

from conftest import REPO, clean_env, prefect_env, sh, shared_project

OWN_DATA = ["+data.source=files", "+collect.labeler=human"]  # no raw data: prepare refuses

ALL_STAGES = {
    "prepare", "tokenizer", "sft", "collect", "rm", "rl@ppo", "rl@grpo", "dpo", "evaluate",
}  # fmt: skip
TEST_POOL = "rlhf-test-process"


@pytest.fixture(scope="module")
def flow_project(trained_project, tmp_path_factory, prefect_server):
    """A copy of the project the first `dvc repro` trained (conftest): the flow finds every
    stage up to date until a test changes something."""
    project = tmp_path_factory.mktemp("flow") / "project"
    shutil.copytree(trained_project, project, ignore=shutil.ignore_patterns("__pycache__"))
    return project


@contextmanager
def inside(project: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The test runs in `project`; what `rlhf run` sets for Prefect ends with the test."""
    monkeypatch.chdir(project)
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    with mock.patch.dict(os.environ):
        yield project


@pytest.fixture
def in_project(flow_project, monkeypatch):
    with inside(flow_project, monkeypatch) as project:
        yield project


@pytest.fixture
def in_copy(flow_project, tmp_path, monkeypatch):
    """A copy of the module's project, for a test whose run changes params and outputs: the
    later tests find the module's project up to date with its own params."""
    copy = tmp_path / "project"
    shutil.copytree(flow_project, copy)
    with inside(copy, monkeypatch) as project:
        yield project


def this_run(flow_state) -> FlowRunFilter:
    return this_run_id(flow_state.state_details.flow_run_id)


def this_run_id(flow_run_id) -> FlowRunFilter:
    return FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))


def stage_states(flow_state) -> dict[str, str]:
    """Task run name (the stage) -> final state name, read back from the Prefect server."""
    return task_states(flow_state.state_details.flow_run_id)


def task_states(flow_run_id) -> dict[str, str]:
    """The flow run's task run names (the stages) -> their final state names."""
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=this_run_id(flow_run_id))
    return {run.name: run.state.name for run in runs}


def artifact_keys(flow_state) -> set[str]:
    """Keys of the artifacts the flow run and its tasks published."""
    with get_client(sync_client=True) as client:
        return {a.key for a in client.read_artifacts(flow_run_filter=this_run(flow_state))}


def test_flow_skips_every_stage_of_an_up_to_date_project_and_publishes_its_metrics(in_project):
    state = pipeline(return_state=True)
    assert state.is_completed(), state.message
    assert stage_states(state) == dict.fromkeys(ALL_STAGES, SKIPPED)
    published = {
        "sft-metrics", "sft-timings", "rl-ppo-metrics", "rl-ppo-timings", "evaluate-metrics",
        "rlhf-evaluation",
    }  # fmt: skip
    assert published <= artifact_keys(state)


def test_what_a_stage_flow_run_publishes_is_found_without_loading_torch(trained_project):
    """Each stage a pipeline dispatches is a flow-run process of its own, which publishes what
    the stage measured; finding those files loads no torch (3 s of CPU a process)."""
    code = (
        "import json, sys; from pathlib import Path; from rlhf.flows.pipeline import measured; "
        f"found = {{s: sorted(measured(s, Path())) for s in {sorted(ALL_STAGES)!r}}}; "
        "print(json.dumps([found, 'torch' in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=trained_project, env=clean_env(),
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    found, torch_loaded = json.loads(done.stdout)
    trained = {"sft", "collect", "rm", "rl@ppo", "rl@grpo", "dpo"}
    assert found == {
        stage: ["metrics", "timings"] if stage in trained else ["metrics"] * (stage == "evaluate")
        for stage in ALL_STAGES
    }
    assert torch_loaded is False


def own_baseline(project: Path) -> Path:
    """The project's own headline numbers as a baseline of one seed (`rlhf compare --json`'s
    layout): std 0, so a number must stay within 4 x 0.01 of its value."""
    _, metrics = read_run(lambda path: (project / path).read_text())
    numbers = compared_numbers(metrics)
    spread = {
        k: {"mean": v, "std": 0.0, "low": v, "high": v, "seeds": 1} for k, v in numbers.items()
    }
    path = project / "baseline.json"
    path.write_text(json.dumps({"spread": spread}))
    return path


def compare_with(baseline: Path, project: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlhf.cli", "compare", "--baseline", baseline.name],
        cwd=project, env=clean_env(), capture_output=True, text=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def canary(flow_project, tmp_path_factory) -> SimpleNamespace:
    """A canary run at the project's own numbers as its baseline (`same`, then `rlhf compare
    --baseline`: `passed`), then one whose PPO override (no KL penalty, a large step) moves
    PPO (`moved`, then `failed`): one PPO rerun that the override and canary tests share."""
    project = tmp_path_factory.mktemp("canary") / "project"
    shutil.copytree(flow_project, project)
    with pytest.MonkeyPatch.context() as monkeypatch, inside(project, monkeypatch):
        baseline = own_baseline(project)
        same = pipeline(baseline=baseline.name, return_state=True)
        passed = compare_with(baseline, project)
        moved = pipeline(
            overrides=["ppo.kl_coef=0.0", "+ppo.lr=0.01"], baseline=baseline.name,
            return_state=True,
        )  # fmt: skip
        failed = compare_with(baseline, project)
        return SimpleNamespace(
            project=project, baseline=baseline, same=same, passed=passed, moved=moved,
            failed=failed,
        )  # fmt: skip


def test_a_ppo_override_reruns_ppo_and_what_follows(canary):
    ran = {"rl@ppo", "evaluate"}
    assert stage_states(canary.moved) == {s: "Completed" if s in ran else SKIPPED
                                          for s in ALL_STAGES}  # fmt: skip
    params = yaml.safe_load((canary.project / "params.yaml").read_text())
    assert params["ppo"]["kl_coef"] == 0.0 and params["ppo"]["lr"] == 0.01
    APILogHandler().flush()  # logs reach the API in batches
    run = LogFilterFlowRunId(any_=[canary.moved.state_details.flow_run_id])
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=run), limit=200)  # the earliest
    messages = "\n".join(log.message for log in logs)
    assert "Running stage 'rl@ppo'" in messages  # DVC's output
    assert "rl@ppo: [" in messages  # the stage's own sample answers


def test_a_canary_run_fails_when_a_headline_number_leaves_the_baselines_band(canary, in_copy):
    """The canary at the baseline's params completes; a change that moves PPO fails it, named
    Drifted, with the drifted numbers in its message and the table artifact; `rlhf compare
    --baseline` agrees, by its exit status."""
    assert canary.same.is_completed(), canary.same.message
    assert set(stage_states(canary.same).values()) == {SKIPPED}
    assert canary.passed.returncode == 0, canary.passed.stderr
    assert "within 4 std of the baseline baseline.json on every number" in canary.passed.stderr

    moved = canary.moved
    assert moved.is_failed() and moved.name == DRIFTED
    assert moved.message.startswith("drifted from the baseline baseline.json (4 std): eval/ppo:")
    with get_client(sync_client=True) as client:
        (table,) = [a for a in client.read_artifacts(flow_run_filter=this_run(moved))
                    if a.key == "rlhf-drift"]  # fmt: skip
    rows = json.loads(table.data)
    drifted = {row["number"] for row in rows if row["verdict"] == "drift"}
    assert drifted and all(key.startswith("eval/ppo:") for key in drifted)  # PPO alone moved
    assert all(f"{key}:" in moved.message for key in drifted)
    assert canary.failed.returncode == 1 and moved.message in canary.failed.stderr

    # refused before any stage runs: a baseline that is not there, a run that does not evaluate
    missing = pipeline(baseline="nowhere.json", return_state=True)
    assert missing.name == REFUSED and "nowhere.json: no such baseline file" in missing.message
    assert stage_states(missing) == {}
    shutil.copy(canary.baseline, in_copy / canary.baseline.name)
    short = pipeline(target="rm", baseline=canary.baseline.name, return_state=True)
    assert short.name == REFUSED and "the target must be evaluate" in short.message


def test_a_target_stops_the_pipeline_there(in_project):
    state = pipeline(target="rm", return_state=True)
    assert state.is_completed(), state.message
    up_to_rm = ("prepare", "tokenizer", "sft", "collect", "rm")
    assert stage_states(state) == dict.fromkeys(up_to_rm, SKIPPED)  # the project is up to date


def test_bad_overrides_fail_before_any_stage_and_leave_params_alone(in_project):
    before = (in_project / "params.yaml").read_text()
    for override in ("ppo.kl_coef=-1", "ppo.kl_coeff=0.1"):
        state = pipeline(overrides=[override], return_state=True)
        assert state.is_failed()
        assert stage_states(state) == {}
    assert "ppo.kl_coef" in str(pipeline(overrides=["ppo.kl_coef=-1"], return_state=True).message)
    assert (in_project / "params.yaml").read_text() == before


def test_a_refused_stage_fails_its_task_with_the_error_line_and_is_not_retried(in_project):
    before = (in_project / "params.yaml").read_text()
    try:
        state = stage_flow(
            stage="prepare",
            overrides=OWN_DATA,
            retries=2,
            return_state=True,
        )
        (in_project / "params.yaml").write_text(before)
        whole = pipeline(
            target="sft",
            overrides=OWN_DATA,
            return_state=True,
        )
    finally:
        (in_project / "params.yaml").write_text(before)
    assert whole.is_failed() and stage_states(whole) == {"prepare": REFUSED}  # stops there
    assert state.is_failed()
    assert state.message.startswith("stage prepare: data.source is 'files' but")
    with get_client(sync_client=True) as client:
        (run,) = client.read_task_runs(flow_run_filter=this_run(state))
    assert (run.state.name, run.run_count) == (REFUSED, 1)
    assert run.state.message.startswith(
        "stage prepare: data.source is 'files' but data/raw/sft.parquet does not exist;"
    )
    assert "Traceback" not in run.state.message


# -- deployments ----------------------------------------------------------------------------
def swapped_prefect_yaml(project) -> None:
    """The repository's deployments with the Docker pool swapped for a process pool, and the
    container's /workspace for the project directory: everything else as shipped."""
    config = yaml.safe_load((REPO / "prefect.yaml").read_text())
    config.pop("definitions")
    config["pull"] = [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(project)}}
    ]
    for deployment in config["deployments"]:
        deployment["work_pool"] = {"name": TEST_POOL}
    (project / "prefect.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def upstream(trained_project, tmp_path_factory):
    """The team's repository: the trained project committed, its outputs pushed to the
    default local remote (`rlhf-pipeline-storage` beside it)."""
    return shared_project(trained_project, tmp_path_factory.mktemp("team") / "upstream")


@pytest.fixture(scope="module")
def worker(upstream, prefect_server):
    """The GPU host's repository, a fresh clone of upstream (no outputs, an empty DVC cache),
    with the deployments registered and a process worker serving them."""
    sh(["git", "clone", "-q", str(upstream), "host"], upstream.parent)
    project = upstream.parent / "host"
    swapped_prefect_yaml(project)
    with get_client(sync_client=True) as client:
        client.create_work_pool(
            WorkPoolCreate(
                name=TEST_POOL,
                type="process",
                base_job_template=ProcessWorker.get_default_base_job_template(),
            )
        )
    env = prefect_env(prefect_server)
    deploy = subprocess.run(
        ["rlhf", "deploy"], cwd=project, env=env, capture_output=True, text=True
    )
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    process = subprocess.Popen(
        ["prefect", "worker", "start", "--pool", TEST_POOL, "--type", "process"],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield project
    process.terminate()
    try:
        process.wait(timeout=2)
    except subprocess.TimeoutExpired:  # a worker busy shutting down its runner
        process.kill()
        process.wait()


def test_pipeline_deployment_schedule_and_parameters_come_from_prefect_yaml(worker):
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("rlhf-pipeline/rlhf-pipeline")
        stage = client.read_deployment_by_name("rlhf-stage/rlhf-stage")
    assert [(s.schedule.cron, s.schedule.timezone) for s in deployment.schedules] == [
        ("0 2 * * *", "UTC")
    ]
    assert deployment.parameters == {
        "target": "evaluate", "overrides": [], "containerized": True, "experiment": True,
        "retries": 1, "wait_for_repository_s": 43200, "start_timeout_s": 900,
        "stage_timeout_s": 86400, "nproc": "auto", "baseline": None, "tolerance_stds": 4.0,
    }  # fmt: skip
    assert stage.parameters["nproc"] == "auto"  # one training process per GPU of the container
    assert deployment.entrypoint == "rlhf/flows/pipeline.py:pipeline"
    schema = stage.parameter_openapi_schema
    assert schema["definitions"]["StageName"]["enum"] == [
        "prepare", "tokenizer", "sft", "collect", "rm",
        "rl@ppo", "rl@reinforce", "rl@rloo", "rl@grpo", "dpo", "evaluate",
    ]  # fmt: skip


def test_stage_names_are_the_declared_stages():
    declared = []
    for name, spec in declared_stages().items():
        declared += [f"{name}@{a}" for a in RL_ALGORITHMS] if spec.foreach else [name]
    assert stage_names() == declared


def test_a_stage_runs_through_run_deployment_on_a_worker(worker):
    started = time.monotonic()
    run = run_deployment(
        "rlhf-stage/rlhf-stage", parameters={"stage": "prepare"}, timeout=300, poll_interval=1
    )
    assert run.state.is_completed(), (run.state, time.monotonic() - started)
    assert task_states(run.id) == {"prepare": "Completed"}  # run: the clone had no outputs
    declared = declared_stages()["prepare"].outputs
    assert [path for path in declared if not (worker / path).exists()] == []


def test_containerized_pipeline_dispatches_each_changed_stage_and_fails_with_its_error(
    worker, monkeypatch
):
    monkeypatch.chdir(worker)
    state = pipeline(target="tokenizer", containerized=True, return_state=True)
    assert state.is_completed(), state.message
    assert (worker / "artifacts" / "tokenizer").is_dir()
    assert recorded_and_dispatched(state.state_details.flow_run_id)[1]["tokenizer"] == "Completed"
    again = pipeline(target="tokenizer", containerized=True, return_state=True)
    assert recorded_and_dispatched(again.state_details.flow_run_id) == (
        {"prepare": SKIPPED, "tokenizer": SKIPPED},
        {},
    )  # up to date: recorded by the pipeline, no stage run (container) started
    before = (worker / "params.yaml").read_text()
    failed = pipeline(
        target="prepare", containerized=True, experiment=True,
        overrides=OWN_DATA, return_state=True,
    )  # fmt: skip
    assert failed.is_failed()
    assert failed.name == REFUSED  # the user's to fix: `rlhf run` exits 2, no retry
    assert failed.message.startswith("stage prepare (flow run ")  # the stage named once
    assert "): data.source is 'files' but" in failed.message
    assert (worker / "params.yaml").read_text() == before
    assert not any((worker / ".rlhf" / "runs").iterdir())


def test_a_stage_no_worker_starts_fails_the_pipeline_within_its_start_timeout(worker, monkeypatch):
    with get_client(sync_client=True) as client:
        client.update_work_pool(TEST_POOL, WorkPoolUpdate(is_paused=True))
    monkeypatch.chdir(worker)
    try:
        # sft has not run on this host (a stage DVC finds up to date would not be dispatched)
        state = pipeline(target="sft", containerized=True, start_timeout_s=3, return_state=True)
    finally:
        with get_client(sync_client=True) as client:
            client.update_work_pool(TEST_POOL, WorkPoolUpdate(is_paused=False))
    assert state.is_failed()
    assert f"stayed Scheduled for 3 s: no worker of pool {TEST_POOL} took it" in state.message
    assert f"prefect worker start --pool {TEST_POOL}" in state.message


def test_a_stage_past_its_limit_is_cancelled_and_waited_for(worker):
    child, state = run_stage_deployment(
        {"stage": "sft", "retries": 0, "workdir": "."}, start_timeout_s=120, timeout_s=1
    )
    assert state.is_failed()
    assert state.message.endswith("past its 1 s limit and was cancelled; it ended Cancelled")
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(child.id).state.name == "Cancelled"  # not still running


def flow_run_logs(flow_run_id) -> list:
    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        return client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))


def held(flow_run_id, timeout_s: float = 60) -> tuple[float, float]:
    """When the run took and released the repository, from its own log lines. The worker's
    flow-run process sends its logs from a background thread, so the last lines can reach
    the server after the run's Completed state: poll until both are there."""
    deadline = time.monotonic() + timeout_s
    while True:
        logs = {log.message.split(": ", 1)[1].split(" ")[0]: log.timestamp.timestamp()
                for log in flow_run_logs(flow_run_id) if ": " in log.message}  # fmt: skip
        if {HOLDING, RELEASED} <= logs.keys() or time.monotonic() > deadline:
            return logs[HOLDING], logs[RELEASED]
        time.sleep(1)


def wait_for(flow_run_ids, timeout_s: float) -> list:
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            runs = [client.read_flow_run(i) for i in flow_run_ids]
            if all(r.state.is_final() for r in runs) or time.monotonic() > deadline:
                return runs
            time.sleep(1)


def recorded_and_dispatched(parent_id) -> tuple[dict[str, str], dict[str, str]]:
    """Stage -> final state name: of the task runs the pipeline run recorded itself (stages up
    to date, not dispatched), and of those in the rlhf-stage runs it dispatched (whose
    stand-ins among the pipeline's own task runs are left out of the first)."""
    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id])
            )
        )
        own, dispatched = (
            client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
            for ids in ([parent_id], [c.id for c in children])
        )
    stand_ins = {c.parent_task_run_id for c in children}
    return (
        {task.name: task.state.name for task in own if task.id not in stand_ins},
        {task.name: task.state.name for task in dispatched},
    )


def test_nightly_deployment_pulls_runs_pushes_and_records_an_experiment(worker, upstream):
    """The nightly run on the GPU host's clone: the code it fetches (a commit pushed upstream
    after the clone), its outputs pulled from the remote so that only what the change and
    the override touch runs, the result recorded as an experiment and pushed; the host's
    branch and params.yaml untouched; and a run started meanwhile waits for it."""
    host_head = sh(["git", "rev-parse", "HEAD"], worker).strip()
    host_params = (worker / "params.yaml").read_text()
    params = yaml.safe_load((upstream / "params.yaml").read_text())
    params["evaluate"]["bootstrap_resamples"] = 100
    (upstream / "params.yaml").write_text(yaml.safe_dump(params))
    sh(["git", "commit", "-q", "-am", "fewer bootstrap resamples"], upstream)
    nightly = "rlhf-pipeline/rlhf-pipeline"
    overrides = ["evaluate.examples_per_task=2"]  # the report alone: no stage trains again
    first = run_deployment(nightly, parameters={"overrides": overrides}, timeout=0)
    time.sleep(1)
    second = run_deployment(nightly, parameters={"target": "prepare"}, timeout=0)
    first, second = wait_for([first.id, second.id], timeout_s=600)
    assert first.state.is_completed(), first.state.message
    assert second.state.is_completed(), second.state.message
    (took, released), (took_2, released_2) = held(first.id), held(second.id)
    assert released <= took_2 or released_2 <= took  # one after the other

    assert sh(["git", "rev-parse", "HEAD"], worker).strip() == host_head  # the branch stays
    assert (worker / "params.yaml").read_text() == host_params  # and the person's files
    ran = {"evaluate"}
    assert recorded_and_dispatched(first.id) == (
        {s: SKIPPED for s in ALL_STAGES if s not in ran},  # their outputs came from the remote
        {s: "Completed" for s in ran},  # only these went to the worker
    )
    assert recorded_and_dispatched(second.id) == ({"prepare": SKIPPED}, {})

    refs = sh(["git", "for-each-ref", "--format=%(objectname) %(refname)", "refs/exps"], worker)
    experiments = dict(line.split(" ")[::-1] for line in refs.splitlines())
    (ref,) = [r for r in experiments if r.endswith(f"-{first.name}")]
    commit = experiments[ref]
    baseline = sh(["git", "rev-parse", f"{commit}^"], worker).strip()
    assert baseline == sh(["git", "rev-parse", "HEAD"], upstream).strip()  # the fetched code
    recorded = yaml.safe_load(sh(["git", "show", f"{commit}:params.yaml"], worker))
    evaluate = recorded["evaluate"]  # the override, and the fetched commit's change
    assert (evaluate["examples_per_task"], evaluate["bootstrap_resamples"]) == (2, 100)
    lock = yaml.safe_load(sh(["git", "show", f"{commit}:dvc.lock"], worker))
    (details,) = [o for o in lock["stages"]["evaluate"]["outs"] if o["path"].endswith(".json")]
    md5 = details["md5"]  # new: the fetched commit's bootstrap draws other intervals
    assert (
        upstream.parent / "rlhf-pipeline-storage" / "files" / "md5" / md5[:2] / md5[2:]
    ).exists()
    assert not any((worker / ".rlhf" / "runs").iterdir())  # the run's checkout is gone
    with get_client(sync_client=True) as client:
        (evaluation,) = [
            a for a in client.read_artifacts(flow_run_filter=this_run_id(first.id))
            if a.key == "rlhf-evaluation"
        ]  # fmt: skip
    assert ref.rsplit("/", 1)[1] in evaluation.data and "dvc exp apply" in evaluation.data


def test_cli_run_goes_through_the_flow_and_reports_failure(in_project):
    done = CliRunner().invoke(app, ["run", "--target", "prepare"])
    assert done.exit_code == 0, done.output
    failed = CliRunner().invoke(app, ["run", "--target", "prepare", "-S", "data.n_train=-5"])
    assert failed.exit_code == 2  # refused: the user's to fix
    assert "data.n_train" in failed.output
    typo = CliRunner().invoke(app, ["run", "--target", "prepare", "-S", "ppo.klcoef=1"])
    assert typo.exit_code == 2
    assert (
        "error: rlhf-pipeline ended Refused: -S ppo.klcoef=1: params.yaml has no key "
        "ppo.klcoef (did you mean ppo.kl_coef?)" in typo.output
    )
    assert "Traceback" not in typo.output


def test_cli_experiment_run_needs_a_commit_to_run(in_project):
    """`rlhf run --experiment` runs a commit; a project with none is one line, not a trace."""
    failed = CliRunner().invoke(app, ["run", "--experiment", "--target", "prepare"])
    assert failed.exit_code == 2  # refused: the user's to fix
    assert "has no commit yet: commit the project first" in failed.output
    assert "Traceback" not in failed.output


def test_cli_run_keeps_its_temporary_servers_history_in_the_repository(in_project, prefect_server):
    """With no server configured, `rlhf run` starts a temporary one in a Prefect home of the
    repository's own (.rlhf/prefect/: its database, its results), not the ~/.prefect that every
    Prefect user of the account shares; a server the user's active profile names is used."""
    home = in_project.parent / "home"
    profiles = home / ".prefect" / "profiles.toml"
    profiles.parent.mkdir(parents=True)
    env = prefect_env(prefect_server) | {"HOME": str(home)}
    del env["PREFECT_API_URL"]
    for setting in ("PREFECT_HOME", "PREFECT_PROFILES_PATH"):
        env.pop(setting, None)
    run = ["rlhf", "run", "--target", "prepare"]
    database = in_project / ".rlhf" / "prefect" / "prefect.db"

    profiles.write_text(f'active = "team"\n[profiles.team]\nPREFECT_API_URL = "{prefect_server}"\n')
    with get_client(sync_client=True) as client:
        before = client.count_flow_runs()
    sh(run, in_project, env)
    with get_client(sync_client=True) as client:
        assert client.count_flow_runs() == before + 1  # on the profile's server
    assert not database.exists()

    profiles.unlink()
    sh(run, in_project, env)
    assert database.exists() and not (home / ".prefect" / "prefect.db").exists()
