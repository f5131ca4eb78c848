"""A finished stage's run in MLflow (`tracking.py` says when): the only module that imports it.

One MLflow run per stage run, named by its DVC address (`rl@ppo`), a child of the pipeline
run's parent run (tagged `rlhf.pipeline_run`, created by the first stage that logs). It holds
what DVC's views show: the params groups the stage depends on (dotted keys, `ppo.kl_coef`), its
headline metrics (`metrics/eval/ppo.json`'s `win_t` as `ppo.win_t`), every curve it logged to
dvclive with its steps, and the evaluation's report folder as artifacts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from rlhf.eval.metric_keys import flattened
from rlhf.params import Params
from rlhf.project import paths
from rlhf.project.specs import StageSpec
from rlhf.train.curves import read_curve

PIPELINE_TAG = "rlhf.pipeline_run"  # on the parent and every stage's run of a pipeline run
PARENT_TAG = "rlhf.pipeline_parent"  # on the parent alone: what finds it
STAGE_TAG = "rlhf.stage"
BATCH = 1000  # MLflow's log_batch takes at most 1000 metrics per call
MAX_PARAM = 6000  # characters of a param's value MLflow keeps


def stage_params(spec: StageSpec, params: Params) -> dict[str, str]:
    """The params groups (and top-level keys) the stage depends on, flattened."""
    every = dataclasses.asdict(params)
    chosen = {group: every[group] for group in spec.params if group in every}
    return {k: json.dumps(v)[:MAX_PARAM] for k, v in flattened("", chosen).items()}


def headline_metrics(spec: StageSpec) -> dict[str, float]:
    """The numbers of the stage's metrics files: a file's keys as they are, a folder's
    (one file per policy) under the policy's name."""
    found: dict[str, Any] = {}
    for target in spec.metrics:
        files = sorted(target.glob("*.json")) if target.is_dir() else [target]
        for file in files:
            prefix = file.stem if target.is_dir() else ""
            found |= flattened(prefix, json.loads(file.read_text()))
    return {k: float(v) for k, v in found.items() if is_number(v)}


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def curves(spec: StageSpec, timestamp: int) -> list[Metric]:
    """Every dvclive curve among the stage's plots (`step<TAB>name` TSV files), step by step,
    named by its path in the folder (`train_loss` per step, `epoch/train_loss` per epoch)."""
    found = []
    for folder in (p for p in spec.plots if p.is_dir()):
        for table in sorted(folder.rglob("*.tsv")):
            name = table.relative_to(folder).with_suffix("").as_posix()
            points = read_curve(table.parent, table.stem)
            found += [Metric(name, v, timestamp, step) for step, v in points if math.isfinite(v)]
    return found


def parent_run(client: MlflowClient, experiment: str, pipeline_run: str) -> str:
    """The id of the pipeline run's parent run, created by the first stage that asks."""
    runs = client.search_runs(
        [experiment], f"tags.`{PARENT_TAG}` = '{pipeline_run}'", max_results=1
    )
    if runs:
        return runs[0].info.run_id
    tags = {PIPELINE_TAG: pipeline_run, PARENT_TAG: pipeline_run}
    run = client.create_run(experiment, run_name=f"pipeline {pipeline_run}", tags=tags)
    return run.info.run_id


def log_stage(
    uri: str, experiment_name: str, pipeline_run: str, spec: StageSpec, params: Params
) -> None:
    """The stage's run, under the pipeline run's parent."""
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment_name)
    experiment = found.experiment_id if found else client.create_experiment(experiment_name)
    parent = parent_run(client, experiment, pipeline_run)
    tags = {"mlflow.parentRunId": parent, PIPELINE_TAG: pipeline_run, STAGE_TAG: spec.address}
    run = client.create_run(experiment, run_name=spec.address, tags=tags).info.run_id
    now = int(time.time() * 1000)
    logged = [Param(k, v) for k, v in stage_params(spec, params).items()]
    metrics = [Metric(k, v, now, 0) for k, v in headline_metrics(spec).items()]
    metrics += curves(spec, now)
    for start in range(0, len(logged), 100):  # log_batch takes at most 100 params per call
        client.log_batch(run, params=logged[start : start + 100])
    for start in range(0, len(metrics), BATCH):
        client.log_batch(run, metrics=metrics[start : start + BATCH])
    if paths.REPORTS in spec.outs and paths.REPORTS.is_dir():
        client.log_artifacts(run, str(paths.REPORTS), artifact_path=str(paths.REPORTS))
    client.set_terminated(run)
    client.set_terminated(parent)  # its end time: the last stage's
