"""Prefect flows over the DVC pipeline: `rlhf-pipeline` (every stage) and `rlhf-stage` (one).

Each stage is one Prefect task. A stage whose code, params, inputs and outputs are as dvc.lock
records them (`dvc status <stage>`, asked once the stages before it have run) is recorded
Skipped; any other delegates to `dvc repro --single-item <stage>`, so a stage is skipped by
exactly the rule `dvc repro` uses. Prefect's own result caching is off on these tasks: their
inputs (a stage name) do not change when params.yaml does, so Prefect would cache what DVC
knows to be stale.

Locally (`containerized=False`) the stages run in this process, one after the other. In
production (`containerized=True`) each stage that is not skipped is a run of the `rlhf-stage`
deployment, which a Docker worker executes in this project's image on a GPU host
(`dispatch.py`). A scheduled run
(`experiment=True`) fetches the code, pulls the DVC outputs, runs in a checkout of its own and
records the outcome as a DVC experiment (`repository.py`). Whatever starts it, one pipeline
run at a time holds a repository (`lock.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx
from dvc.exceptions import DvcException
from dvc.repo import Repo
from prefect import flow, get_client, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import FlowRun, TaskRun
from prefect.context import FlowRunContext, get_run_context
from prefect.states import Completed, Failed, State

from rlhf.errors import PipelineError
from rlhf.eval.metric_keys import flattened
from rlhf.eval.report import policies_table, win_rates_table
from rlhf.flows.dispatch import run_stage_deployment
from rlhf.flows.lock import one_run_per_repository
from rlhf.flows.repository import (
    RepositoryError,
    checkout_for_run,
    commit_to_run,
    has_remote,
    pull_inputs,
    push_outputs,
    record_experiment,
    remove_checkout,
    sweep_checkouts,
    valid_experiment_name,
)
from rlhf.flows.stage_names import StageName
from rlhf.params import ParamsError
from rlhf.project import drift, paths
from rlhf.project.folders import DVC_FILE
from rlhf.project.metric_files import read_metrics
from rlhf.project.overrides import set_params
from rlhf.project.specs import filed_as
from rlhf.stages.support.entry import ERROR_PREFIX, FAILED_PREFIX
from rlhf.stages.support.launch import NPROC_ENV
from rlhf.stages.support.tracking import PIPELINE_RUN_ENV

SKIPPED = "Skipped"  # state name of a stage DVC found up to date
REFUSED = "Refused"  # state name of a stage that reported an error the user must fix
DRIFTED = "Drifted"  # state name of a canary run whose numbers left the baseline's band


def stages_for(target: str, root: Path) -> list[str]:
    """`target` and every stage it depends on, in the order DVC runs them."""
    with Repo(str(root)) as repo:
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        by_name = {stage.name: stage for stage in graph}
        if target not in by_name:
            raise ParamsError(
                f"stage {target!r} is not in {root / 'dvc.yaml'}, which has "
                f"{', '.join(by_name)}; an RL stage runs for the algorithms in rl_algorithms"
            )
        needed = {target} | {s.name for s in nx.descendants(graph, by_name[target])}
        order = [s.name for s in reversed(list(nx.topological_sort(graph)))]
    return [name for name in order if name in needed]


def measured(stage: str, root: Path) -> dict[str, dict[str, Any]]:
    """What stage `stage` (`sft`, `rl@ppo`) measured (its details: all of it) and how fast it
    ran, by kind; a kind it has no file of is left out. The details file is found among the
    stage's outs in dvc.yaml, not in its SPEC: the stage modules import torch, which a stage's
    flow run, waiting on `dvc repro`, need not load (3 s of CPU)."""
    with Repo(str(root)) as repo:
        (declared,) = repo.stage.collect(in_dvc_yaml(root, stage))
        outs = [Path(out.def_path) for out in declared.outs]
    kinds = {}
    for details in outs:
        if details.parent == paths.DETAILS and (root / details).exists():
            kinds["metrics"] = read_metrics(details.stem, root)  # `eval` for evaluate
    timings = root / paths.timings_file(filed_as(stage))
    if timings.exists():
        kinds["timings"] = json.loads(timings.read_text())
    return kinds


def publish_metrics(stage: str, root: Path) -> None:
    """What the stage measured, and its timings, as one Prefect table artifact each
    (`rl@ppo`'s are keyed `rl-ppo-metrics` and `rl-ppo-timings`: artifact keys take
    lowercase letters, digits and dashes only)."""
    for kind, numbers in measured(stage, root).items():
        create_table_artifact(
            key=f"{stage.replace('@', '-')}-{kind}",
            table=[{"metric": k, "value": v} for k, v in flattened("", numbers).items()],
            description=f"{kind} of stage {stage}",
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


def pipeline_run_id() -> str:
    """The pipeline flow run a stage belongs to, which names its parent run in a tracker: the
    flow run of this task, or for a run of the stage deployment that a pipeline started (in
    its container), that pipeline's, the flow run of the task that started it."""
    flow_run = FlowRunContext.get().flow_run
    if flow_run.parent_task_run_id is None:
        return str(flow_run.id)
    with get_client(sync_client=True) as client:
        return str(client.read_task_run(flow_run.parent_task_run_id).flow_run_id)


@task(task_run_name="{stage}", cache_policy=NO_CACHE, retry_condition_fn=retry_unless_refused)
def dvc_stage(stage: str, workdir: Path, nproc: str | None = None) -> State:
    """`dvc repro --single-item <stage>` in `workdir`, its output streamed into the task's log;
    a training stage runs as `nproc` data-parallel processes (`RLHF_NPROC`; None: as the
    environment says).

    Ends Completed when the stage ran and Completed named "Skipped" when DVC found it up to
    date, so a flow run shows at a glance which stages did work. A stage that reported an
    error the user must fix ends Failed named "Refused" with that error as its message.
    """
    logger = get_run_logger()
    command = ["dvc", "repro", "--single-item", stage]
    ran, errors, failures = False, [], []
    env = os.environ | ({NPROC_ENV: nproc} if nproc else {}) | {PIPELINE_RUN_ENV: pipeline_run_id()}
    with subprocess.Popen(
        command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, bufsize=1,
    ) as process:  # fmt: skip
        assert process.stdout is not None
        for line in process.stdout:
            logger.info(line.rstrip())
            ran = ran or f"Running stage '{stage}'" in line
            if line.startswith(ERROR_PREFIX):
                errors.append(line.removeprefix(ERROR_PREFIX).strip())
            elif line.startswith(FAILED_PREFIX):  # a killed worker: a retry resumes
                failures.append(line.removeprefix(FAILED_PREFIX).strip())
            elif line.startswith("ERROR: "):  # DVC's own: a missing input, a bad params.yaml
                failures.append(line.strip())
    if process.returncode and errors:
        return Failed(name=REFUSED, message=f"stage {stage}: {errors[-1]}")
    if process.returncode:
        said = f": {failures[0]}" if failures else ""
        raise RuntimeError(f"{' '.join(command)} exited with {process.returncode}{said}")
    if ran:
        publish_metrics(stage, workdir)
        return Completed(message=f"stage {stage} ran")
    return skipped(stage, workdir)


def skipped(stage: str, workdir: Path) -> State:
    """The state of a stage DVC found up to date, its metrics published as a run's are."""
    publish_metrics(stage, workdir)
    return Completed(name=SKIPPED, message=f"stage {stage} is up to date")


def up_to_date(stage: str, workdir: Path) -> bool:
    """Whether DVC finds `stage` up to date in `workdir` (`dvc status <stage>` says nothing):
    its code, params, inputs and outputs all as dvc.lock records them, the rule by which
    `dvc repro` skips it. Anything else, a missing output included, counts as changed, and
    so does a stage DVC cannot judge: `dvc repro` then says why, as it would have."""
    try:
        with Repo(str(workdir)) as repo:
            return not repo.status(targets=[in_dvc_yaml(workdir, stage)])
    except DvcException:
        return False


def in_dvc_yaml(root: Path, stage: str) -> str:
    """`stage` of `root`'s dvc.yaml as a DVC target. DVC resolves a bare stage name against the
    working directory's dvc.yaml, which for a run's checkout (`.rlhf/runs/<run>`) is the
    repository's own, not the checkout's."""
    return f"{(root / DVC_FILE).resolve()}:{stage}"


@task(task_run_name="{stage}", cache_policy=NO_CACHE)
def skipped_stage(stage: str, workdir: Path) -> State:
    """A stage the pipeline found up to date: recorded as Skipped, as `dvc_stage` records one
    `dvc repro` skips, without starting DVC (a second or two of CPU) or, in production, a
    container on a GPU host only to be told so."""
    return skipped(stage, workdir)


@flow(name="rlhf-stage")
def stage_flow(
    stage: StageName,
    overrides: list[str] | None = None,
    retries: int = 1,
    workdir: str = ".",
    nproc: str | None = None,
) -> State | None:
    """One pipeline stage: what the `rlhf-stage` deployment runs in a GPU container.

    workdir: the DVC repository to run in, relative to the flow's working directory (a
        scheduled run's own checkout, `.rlhf/runs/<name>`).
    nproc: data-parallel processes of a training stage, a number or `auto` (one per visible
        GPU); None: the container's RLHF_NPROC, else 1. Not a param: DVC's stage is the same.
    """
    directory = Path(workdir)
    set_params(directory / paths.PARAMS, overrides or [])
    return run_stage(StageName(stage).value, retries, directory, nproc)


def run_stage(stage: str, retries: int, workdir: Path, nproc: str | None) -> State | None:
    """The stage as a task run; None if it completed, else a Failed state with the task's
    message, which a flow returns to end with the stage's error as its own state message."""
    options = dvc_stage.with_options(retries=retries, retry_delay_seconds=10)
    state = options(stage, workdir, nproc, return_state=True)
    return Failed(name=state.name, message=state.message) if state.is_failed() else None


def run_stages(stages: list[str], workdir: Path, run: PipelineRun) -> State | None:
    """Each stage in order, here or as a run of the stage deployment, but for those DVC finds
    up to date; the first failure ends the pipeline with the stage's own one-line error as
    the state's message."""
    logger = get_run_logger()
    for stage in stages:
        if up_to_date(stage, workdir):  # the stages before it ran in the same workdir
            skipped_stage(stage, workdir)
            continue
        if not run.containerized:
            if failed := run_stage(stage, run.retries, workdir, run.nproc):
                return failed
            continue
        parameters = {"stage": stage, "retries": run.retries, "workdir": str(workdir)}
        parameters |= {"nproc": run.nproc} if run.nproc else {}
        child, state = run_stage_deployment(parameters, run.start_timeout_s, run.stage_timeout_s)
        if not state.is_completed():
            said = (state.message or "").removeprefix(f"stage {stage}: ")  # named once
            refused = {"name": REFUSED} if state.name == REFUSED else {}  # the user's to fix
            return Failed(message=f"stage {stage} (flow run {child.name}): {said}", **refused)
        logger.info("stage %s: flow run %s completed", stage, child.name)
    return None


@dataclass(frozen=True)
class PipelineRun:
    """How the pipeline dispatches and waits: the flow's parameters past the target."""

    containerized: bool
    retries: int
    start_timeout_s: float
    stage_timeout_s: float
    nproc: str | None


@dataclass(frozen=True)
class Canary:
    """A run that fails when its headline numbers drift from a baseline (`drift.py`)."""

    baseline: Path  # a committed `rlhf compare --json` file, relative to the repository
    stds: float  # the band's half-width in the baseline's standard deviations

    def refuse_early(self, root: Path, stages: list[str]) -> None:
        """Before any stage runs: the baseline must be readable, and the run must evaluate
        (the headline numbers are the evaluation's and the reward model's)."""
        if "evaluate" not in stages:
            raise ParamsError(
                f"baseline {self.baseline}: a canary reads the evaluation's numbers, so the "
                "target must be evaluate"
            )
        drift.read_baseline(root / self.baseline)

    def verdict(self, root: Path) -> State | None:
        """The run's numbers against the baseline, as the table artifact `rlhf-drift`; a
        Failed state named "Drifted" saying what drifted, or None when nothing did."""
        found = drift.check(root, self.baseline, self.stds)
        create_table_artifact(key="rlhf-drift", table=found.rows(), description=found.reason())
        if found.failures:
            return Failed(name=DRIFTED, message=found.reason())
        get_run_logger().info("canary: %s", found.reason())
        return None


@flow(name="rlhf-pipeline")
def pipeline(
    target: StageName = StageName["evaluate"],
    overrides: list[str] | None = None,
    containerized: bool = False,
    experiment: bool = False,
    retries: int = 1,
    wait_for_repository_s: float | None = None,
    start_timeout_s: float = 900,
    stage_timeout_s: float = 86400,
    nproc: str | None = None,
    baseline: str | None = None,
    tolerance_stds: float = drift.DEFAULT_STDS,
) -> State | None:
    """Every stage up to `target` in DVC order; the first that fails ends the run.

    overrides: `key=value` params (e.g. `ppo.kl_coef=0.05`), applied as `dvc exp run -S`
        does. experiment: fetch the code, pull its DVC outputs, run in a checkout of its own with
        the overrides, record the result as a DVC experiment named after this flow run and
        push it; the repository's own files, params.yaml included, are left alone. Without
        it the overrides are written into params.yaml and the stages run in place.
    containerized: run each stage as an `rlhf-stage` deployment run; a run no worker takes
        within `start_timeout_s`, or that runs past `stage_timeout_s`, is cancelled.
    retries: per stage; a retried training stage resumes from its last checkpoint.
    wait_for_repository_s: how long to wait while another pipeline run holds this
        repository (None: until it ends).
    nproc: data-parallel processes of each training stage (`rlhf-stage`'s parameter).
    baseline: a canary: a committed `rlhf compare --json` file (docs/seeds.json is the
        default's); the run ends Failed, named "Drifted", when a headline number leaves the
        baseline's mean ± `tolerance_stds` standard deviations, with the table artifact
        `rlhf-drift` (number, baseline mean ± std, this run, verdict) either way.
    """
    root = Path.cwd()
    run = PipelineRun(containerized, retries, start_timeout_s, stage_timeout_s, nproc)
    canary = Canary(Path(baseline), tolerance_stds) if baseline else None
    last_stage, changes = StageName(target).value, list(overrides or [])
    try:
        with one_run_per_repository(root, wait_for_repository_s):
            if experiment:
                return experiment_run(root, last_stage, changes, run, canary)
            set_params(root / paths.PARAMS, changes)
            stages = stages_for(last_stage, root)
            if canary:
                canary.refuse_early(root, stages)
            if failed := run_stages(stages, Path("."), run):
                return failed
            publish_evaluation(stages, root)
            return canary.verdict(root) if canary else None
    except PipelineError as error:  # bad params, a git or DVC step, a busy repository
        return Failed(name=REFUSED, message=str(error))


def experiment_run(
    root: Path, target: str, overrides: list[str], run: PipelineRun, canary: Canary | None
) -> State | None:
    """A scheduled run: the code fetched, the stages run in a checkout of its own (whose
    outputs were pulled from the DVC remote first), the outcome pushed and saved as an
    experiment. A run that fails still pushes what its finished stages made, so the next
    one does not make it again."""
    logger = get_run_logger()
    name = valid_experiment_name(experiment_name(get_run_context().flow_run), root)
    baseline, fetched = commit_to_run(root)
    logger.info("%s: running %s as experiment %s", fetched, baseline[:7], name)
    sweep_checkouts(root)
    checkout = checkout_for_run(root, name, baseline)
    try:
        set_params(checkout / paths.PARAMS, overrides)
        remote = has_remote(checkout)
        if remote:
            pull_inputs(checkout)
        stages = stages_for(target, checkout)
        if canary:
            canary.refuse_early(checkout, stages)
        if failed := run_stages(stages, checkout.relative_to(root), run):
            if remote:
                push_what_finished(checkout)
            return failed
        if remote:
            push_outputs(checkout)
        recorded = record_experiment(checkout, name, root)
        logger.info("experiment %s (%s) recorded in %s", name, recorded[:7], root)
        publish_evaluation(stages, checkout, Experiment(name, recorded, baseline))
        return canary.verdict(checkout) if canary else None
    finally:
        remove_checkout(checkout)


def push_what_finished(checkout: Path) -> None:
    try:
        push_outputs(checkout)
    except RepositoryError as error:  # the run's own failure is the one to report
        get_run_logger().warning("outputs of the finished stages were not pushed: %s", error)


def experiment_name(flow_run: FlowRun) -> str:
    """`run-20261124-0200-sly-oriole`: when it started, then the flow run's own name."""
    started = flow_run.start_time or flow_run.expected_start_time
    return f"run-{started:%Y%m%d-%H%M}-{flow_run.name}"


@dataclass(frozen=True)
class Experiment:
    name: str
    commit: str
    baseline: str

    def markdown(self) -> list[str]:
        return [
            f"Recorded as DVC experiment **{self.name}** (commit `{self.commit[:7]}`, from "
            f"`{self.baseline[:7]}`): `dvc exp show --rev {self.baseline[:7]}` lists it, "
            f"`dvc exp apply {self.name}` brings its params and results into a workspace, "
            f"`dvc exp branch {self.name} <branch>` keeps it.",
            "",
        ]


def publish_evaluation(stages: list[str], root: Path, experiment: Experiment | None = None):
    """The evaluation tables as the markdown artifact `rlhf-evaluation`, headed by the
    experiment that holds them."""
    if "evaluate" not in stages or not (root / paths.details_file("eval")).exists():
        return
    head = experiment.markdown() if experiment else []
    create_markdown_artifact(
        key="rlhf-evaluation",
        markdown="\n".join([*head, evaluation_markdown(read_metrics("eval", root))]),
        description="Gold win rates, scores and KL of every policy",
    )
