"""Prefect flows over the DVC pipeline: `rlhf-pipeline` (every stage) and `rlhf-stage` (one).

Each stage is one Prefect task that delegates to `dvc repro --single-item <stage>`, so a stage
whose code, params and inputs are unchanged is skipped by exactly the rule `dvc repro` uses.
Prefect's own result caching is off on these tasks: their inputs (a stage name) do not change
when params.yaml does, so Prefect would cache what DVC knows to be stale.

Locally (`containerized=False`) the stages run in this process, one after the other. In
production (`containerized=True`) each stage is a run of the `rlhf-stage` deployment, which a
Docker worker executes in this project's image on a GPU host; the pipeline waits for each and
fails if one did not complete (`run_deployment` returns failed runs without raising).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import networkx as nx
import yaml
from dvc.repo import Repo
from dvc.utils.hydra import apply_overrides
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun
from prefect.deployments import run_deployment
from prefect.states import Completed, Failed, State

from rlhf.eval.report import policies_table, win_rates_table
from rlhf.params import parse_params
from rlhf.stages import paths
from rlhf.stages.dvcfile import declared_stages
from rlhf.stages.entry import ERROR_PREFIX

STAGE_DEPLOYMENT = "rlhf-stage/rlhf-stage"
SKIPPED = "Skipped"  # state name of a stage DVC found up to date
REFUSED = "Refused"  # state name of a stage that reported an error the user must fix


def stages_for(target: str) -> list[str]:
    """`target` and every stage it depends on, in the order DVC runs them."""
    with Repo(".") as repo:
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        by_name = {stage.addressing: stage for stage in graph}
        if target not in by_name:
            raise ValueError(f"unknown stage {target!r}; dvc.yaml has {', '.join(by_name)}")
        needed = {target} | {s.addressing for s in nx.descendants(graph, by_name[target])}
        order = [s.addressing for s in reversed(list(nx.topological_sort(graph)))]
    return [name for name in order if name in needed]


def set_params(overrides: Sequence[str], params_file: Path = paths.PARAMS) -> None:
    """Apply `key=value` overrides to params.yaml as `dvc exp run -S` does (Hydra syntax,
    comments kept), but only once the result passes the params schema."""
    if not overrides:
        return
    with tempfile.TemporaryDirectory(dir=params_file.parent) as tmp:
        staged = Path(tmp) / params_file.name
        shutil.copy(params_file, staged)
        apply_overrides(staged, list(overrides))
        parse_params(yaml.safe_load(staged.read_text()), str(params_file))  # names key and value
        staged.replace(params_file)


def stage_metrics(address: str) -> tuple[Path, ...]:
    """The metrics files stage `address` (`sft`, `rl@ppo`) declares."""
    name, _, item = address.partition("@")
    return declared_stages()[name].filled(item or None).metrics


def flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested metrics as dotted keys, the way `dvc metrics show` names them."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def publish_metrics(stage: str) -> None:
    """Each of the stage's metrics files as one Prefect table artifact (`rl@ppo`'s is keyed
    `rl-ppo-metrics`: artifact keys take lowercase letters, digits and dashes only)."""
    for file in stage_metrics(stage):
        if file.exists():
            rows = flatten(json.loads(file.read_text()))
            create_table_artifact(
                key=f"{stage.replace('@', '-')}-metrics",
                table=[{"metric": k, "value": v} for k, v in rows.items()],
                description=f"{file} after stage {stage}",
            )


def evaluation_markdown(metrics: dict[str, Any]) -> str:
    """The evaluation's policy and win-rate tables, as in reports/eval.md."""
    lines = ["# RLHF evaluation", "", *policies_table(metrics)]
    for judge in metrics.get("win_rate", {}):
        lines += [f"Win rates judged by {judge}, ties half, 95% bootstrap over prompts:", ""]
        lines += win_rates_table(metrics, judge)
    return "\n".join(lines)


def retry_unless_refused(task: object, task_run: TaskRun, state: State) -> bool:
    """Retry a crashed or killed stage (it resumes), not one that reported bad params or
    data: it would only fail again the same way."""
    return state.name != REFUSED


@task(task_run_name="{stage}", cache_policy=NO_CACHE, retry_condition_fn=retry_unless_refused)
def dvc_stage(stage: str) -> State:
    """`dvc repro --single-item <stage>`, its output streamed into the task's log.

    Ends Completed when the stage ran and Completed named "Skipped" when DVC found it up to
    date, so a flow run shows at a glance which stages did work. A stage that reported an
    error the user must fix ends Failed named "Refused" with that error as its message.
    """
    logger = get_run_logger()
    command = ["dvc", "repro", "--single-item", stage]
    ran, errors, dvc_errors = False, [], []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            logger.info(line.rstrip())
            ran = ran or f"Running stage '{stage}'" in line
            if line.startswith(ERROR_PREFIX):
                errors.append(line.removeprefix(ERROR_PREFIX).strip())
            elif line.startswith("ERROR: "):  # DVC's own: a missing input, a bad params.yaml
                dvc_errors.append(line.strip())
    if process.returncode and errors:
        return Failed(name=REFUSED, message=f"stage {stage}: {errors[-1]}")
    if process.returncode:
        said = f": {dvc_errors[0]}" if dvc_errors else ""
        raise RuntimeError(f"{' '.join(command)} exited with {process.returncode}{said}")
    publish_metrics(stage)
    if ran:
        return Completed(message=f"stage {stage} ran")
    return Completed(name=SKIPPED, message=f"stage {stage} is up to date")


@flow(name="rlhf-stage")
def stage_flow(stage: str, overrides: list[str] | None = None, retries: int = 1) -> State | None:
    """One pipeline stage: what the `rlhf-stage` deployment runs in a container."""
    set_params(overrides or [])
    return run_stage(stage, retries)


def run_stage(stage: str, retries: int) -> State | None:
    """The stage as a task run; None if it completed, else a Failed state with the task's
    message, which a flow returns to end with the stage's error as its own state message."""
    options = dvc_stage.with_options(retries=retries, retry_delay_seconds=10)
    state = options(stage, return_state=True)
    return Failed(name=state.name, message=state.message) if state.is_failed() else None


@flow(name="rlhf-pipeline")
def pipeline(
    target: str = "evaluate",
    overrides: list[str] | None = None,
    containerized: bool = False,
    retries: int = 1,
) -> State | None:
    """Every stage up to `target` in DVC order; the first that fails ends the run.

    overrides: `key=value` params (e.g. `ppo.kl_coef=0.05`), written into params.yaml as
        `dvc exp run -S` does. retries: per stage; a retried training stage resumes from its
        last checkpoint. containerized: run each stage as an `rlhf-stage` deployment run.
    """
    logger = get_run_logger()
    overrides = list(overrides or [])
    stages = stages_for(target)
    if not containerized:
        set_params(overrides)
    for stage in stages:
        if not containerized:
            if failed := run_stage(stage, retries):
                return failed
            continue
        child = run_deployment(
            STAGE_DEPLOYMENT,
            parameters={"stage": stage, "overrides": overrides, "retries": retries},
            timeout=None,
        )
        if child.state is None or not child.state.is_completed():
            state = child.state.name if child.state else "unknown"
            raise RuntimeError(f"stage {stage}: flow run {child.name} ended {state}")
        logger.info("stage %s: flow run %s completed", stage, child.name)
    if "evaluate" in stages and paths.EVAL_METRICS.exists():
        create_markdown_artifact(
            key="rlhf-evaluation",
            markdown=evaluation_markdown(json.loads(paths.EVAL_METRICS.read_text())),
            description="Gold win rates, scores and KL of every policy",
        )
