"""The Prefect flows against a real temporary Prefect server and real DVC, on the tiny config."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml
from prefect import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.deployments import run_deployment
from prefect.logging.handlers import APILogHandler
from prefect.settings import PREFECT_API_URL
from prefect.testing.utilities import prefect_test_harness
from prefect.workers.process import ProcessWorker
from typer.testing import CliRunner

from rlhf.cli import app
from rlhf.flows.pipeline import REFUSED, SKIPPED, pipeline, stage_flow

from conftest import REPO, clean_env, init_dvc_repo, make_project

ALL_STAGES = {
    "prepare", "tokenizer", "sft", "collect", "rm", "rl@ppo", "rl@grpo", "dpo", "evaluate",
}  # fmt: skip
TEST_POOL = "rlhf-test-process"


@pytest.fixture(scope="module")
def prefect_server():
    with prefect_test_harness(server_startup_timeout=60):
        yield PREFECT_API_URL.value()


@pytest.fixture(scope="module")
def flow_project(trained_project, tmp_path_factory, prefect_server):
    """A copy of the project the first `dvc repro` trained (conftest): the flow finds every
    stage up to date until a test changes something."""
    project = tmp_path_factory.mktemp("flow") / "project"
    shutil.copytree(trained_project, project, ignore=shutil.ignore_patterns("__pycache__"))
    return project


@pytest.fixture
def in_project(flow_project, monkeypatch):
    monkeypatch.chdir(flow_project)
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    return flow_project


def this_run(flow_state) -> FlowRunFilter:
    return FlowRunFilter(id=FlowRunFilterId(any_=[flow_state.state_details.flow_run_id]))


def stage_states(flow_state) -> dict[str, str]:
    """Task run name (the stage) -> final state name, read back from the Prefect server."""
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=this_run(flow_state))
    return {run.name: run.state.name for run in runs}


def artifact_keys(flow_state) -> set[str]:
    """Keys of the artifacts the flow run and its tasks published."""
    with get_client(sync_client=True) as client:
        return {a.key for a in client.read_artifacts(flow_run_filter=this_run(flow_state))}


def test_flow_skips_every_stage_of_an_up_to_date_project_and_publishes_its_metrics(in_project):
    state = pipeline(return_state=True)
    assert state.is_completed(), state.message
    assert stage_states(state) == dict.fromkeys(ALL_STAGES, SKIPPED)
    published = {"sft-metrics", "rl-ppo-metrics", "evaluate-metrics", "rlhf-evaluation"}
    assert published <= artifact_keys(state)


def test_a_ppo_override_reruns_ppo_and_what_follows(in_project):
    state = pipeline(overrides=["ppo.kl_coef=0.3"], return_state=True)
    assert state.is_completed(), state.message
    ran = {"rl@ppo", "evaluate"}
    assert stage_states(state) == {s: "Completed" if s in ran else SKIPPED for s in ALL_STAGES}
    assert yaml.safe_load((in_project / "params.yaml").read_text())["ppo"]["kl_coef"] == 0.3
    APILogHandler().flush()  # logs reach the API in batches
    run = LogFilterFlowRunId(any_=[state.state_details.flow_run_id])
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=run), limit=200)  # the earliest
    messages = "\n".join(log.message for log in logs)
    assert "Running stage 'rl@ppo'" in messages  # DVC's output
    assert "rl@ppo: [" in messages  # the stage's own sample answers


def test_a_target_stops_the_pipeline_there(in_project):
    state = pipeline(target="rm", return_state=True)
    assert set(stage_states(state)) == {"prepare", "tokenizer", "sft", "collect", "rm"}


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
            stage="prepare", overrides=["+data.source=files"], retries=2, return_state=True
        )
        (in_project / "params.yaml").write_text(before)
        whole = pipeline(target="sft", overrides=["+data.source=files"], return_state=True)
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
def worker(tmp_path_factory, prefect_server):
    """A fresh DVC project with the deployments registered and a process worker serving them."""
    project = init_dvc_repo(make_project(tmp_path_factory.mktemp("deployed")))
    swapped_prefect_yaml(project)
    with get_client(sync_client=True) as client:
        client.create_work_pool(
            WorkPoolCreate(
                name=TEST_POOL,
                type="process",
                base_job_template=ProcessWorker.get_default_base_job_template(),
            )
        )
    env = clean_env() | {
        "PREFECT_API_URL": prefect_server,
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
    }
    deploy = subprocess.run(
        ["rlhf", "deploy"], cwd=project, env=env, capture_output=True, text=True
    )
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    process = subprocess.Popen(
        ["prefect", "worker", "start", "--pool", TEST_POOL, "--type", "process"],
        cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
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
    assert [(s.schedule.cron, s.schedule.timezone) for s in deployment.schedules] == [
        ("0 2 * * *", "UTC")
    ]
    assert deployment.parameters == {
        "target": "evaluate", "overrides": [], "containerized": True, "retries": 1,
    }  # fmt: skip
    assert deployment.entrypoint == "rlhf/flows/pipeline.py:pipeline"


def test_shipped_stage_deployment_requests_gpus_in_the_project_image():
    stage = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"][0]
    variables = stage["work_pool"]["job_variables"]
    assert stage["name"] == "rlhf-stage" and variables["image"] == "rlhf-pipeline:latest"
    requests = variables["container_create_kwargs"]["device_requests"]
    assert requests == [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]


def test_a_stage_runs_through_run_deployment_on_a_worker(worker):
    started = time.monotonic()
    run = run_deployment(
        "rlhf-stage/rlhf-stage", parameters={"stage": "prepare"}, timeout=300, poll_interval=1
    )
    assert run.state.is_completed(), (run.state, time.monotonic() - started)
    assert (worker / "data" / "prepared" / "prompts_heldout.parquet").exists()


def test_containerized_pipeline_dispatches_each_stage_and_fails_on_a_failed_child(
    worker, monkeypatch
):
    monkeypatch.chdir(worker)
    state = pipeline(target="tokenizer", containerized=True, return_state=True)
    assert state.is_completed(), state.message
    assert (worker / "artifacts" / "tokenizer").is_dir()
    failed = pipeline(
        target="prepare", containerized=True, overrides=["data.n_train=-5"], return_state=True
    )
    assert failed.is_failed()
    assert "stage prepare" in failed.message and "Failed" in failed.message


def test_cli_run_goes_through_the_flow_and_reports_failure(in_project):
    done = CliRunner().invoke(app, ["run", "--target", "prepare"])
    assert done.exit_code == 0, done.output
    failed = CliRunner().invoke(app, ["run", "--target", "prepare", "-S", "data.n_train=-5"])
    assert failed.exit_code == 1
    assert "data.n_train" in failed.output
