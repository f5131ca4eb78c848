"""The runs a repository holds: its workspace and every DVC experiment, with their params and
metrics, read from git (an experiment is a commit under `refs/exps/`) without checking
anything out, so that `rlhf compare` leaves the workspace as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from rlhf.errors import PipelineError
from rlhf.eval.metric_keys import flattened
from rlhf.eval.seeds import compared_files, compared_numbers, params_changed
from rlhf.params import ParamsError, parse_params
from rlhf.project import paths

# refs/exps/<first 2 hex digits of the baseline>/<the other 38>/<name>: DVC's experiment refs
# (refs/exps/apply/..., refs/exps/exec/..., refs/exps/celery/... are its bookkeeping)
EXPERIMENT_REF = re.compile(r"refs/exps/(?P<baseline>[0-9a-f]{2}/[0-9a-f]{38})/(?P<name>[^/]+)")
WORKSPACE = "workspace"
HEAD = "HEAD"  # the run HEAD commits


@dataclass(frozen=True)
class RecordedRun:
    name: str  # the experiment's name, or "workspace"
    baseline: str  # the commit it ran from (the workspace: HEAD)
    params: dict[str, Any]  # every param in effect (defaults filled in), dotted keys
    metrics: dict[str, Any]  # metrics file stem (`eval`) -> its contents


def recorded_runs(root: Path) -> list[RecordedRun]:
    """The workspace's run, HEAD's committed one, then every experiment's that has the
    compared metrics files. HEAD's is the workspace's but where a `dvc exp run -S` without
    `--temp` (or an uncommitted run) replaced it there."""
    head = git(["rev-parse", "HEAD"], root).strip()
    runs = [RecordedRun(WORKSPACE, head, *read_run(lambda path: (root / path).read_text()))]
    with contextlib.suppress(FileNotFoundError):  # a commit without metrics yet
        runs.append(RecordedRun(HEAD, head, *read_run(partial(committed_text, root, "HEAD"))))
    listed = git(["for-each-ref", "--format=%(refname)", "refs/exps"], root).split()
    for ref in listed:
        if match := EXPERIMENT_REF.fullmatch(ref):
            try:
                params, metrics = read_run(partial(committed_text, root, ref))
            except FileNotFoundError:  # an experiment that failed before its metrics
                continue
            baseline = match["baseline"].replace("/", "")
            runs.append(RecordedRun(match["name"], baseline, params, metrics))
    return runs


def read_run(read: Callable[[Path], str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The params in effect and the compared metrics files, through `read(path) -> text`."""
    params = read_params(read)
    names = compared_files(params.get("rl_algorithms", ()))
    return params, {name: json.loads(read(paths.metrics_file(name))) for name in names}


def read_params(read: Callable[[Path], str]) -> dict[str, Any]:
    """The params in effect (defaults filled in), dotted keys, through `read(path) -> text`."""
    raw = yaml.safe_load(read(paths.PARAMS)) or {}
    try:  # a key a params.yaml leaves out is at its default: the same run as one that says so
        params: Any = dataclasses.asdict(parse_params(raw))
    except ParamsError:  # written for an older schema: compared as it is
        params = raw
    return flattened("", params)


def committed_params(root: Path) -> dict[str, Any]:
    """The params HEAD commits: what a seed spread is for, whatever the workspace holds (a
    `dvc exp run -S` without `--temp` leaves its change there)."""
    return read_params(partial(committed_text, root, "HEAD"))


def committed_text(root: Path, commit: str, path: Path) -> str:
    return git(["show", f"{commit}:{path}"], root)


def git(args: list[str], root: Path) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if done.returncode:
        said = done.stderr.strip().splitlines()
        if args[0] == "show":  # the file is not in that commit
            raise FileNotFoundError(args[-1])
        raise PipelineError(f"git {args[0]} in {root}: {said[-1] if said else 'failed'}")
    return done.stdout


def split_by_seed(
    runs: list[RecordedRun], baseline_params: dict[str, Any]
) -> tuple[dict[object, dict[str, float]], dict[str, tuple[list[str], dict[str, float]]]]:
    """The compared numbers of the runs of `baseline_params` at any seed, from the workspace's
    commit (`runs[0]`), by seed (the first run at each: the workspace's own), and of every
    other run, by name, with the params it changed (or the other commit it ran from)."""
    workspace = runs[0]
    baseline = {k: v for k, v in baseline_params.items() if k != "seed"}
    by_seed: dict[object, dict[str, float]] = {}
    others: dict[str, tuple[list[str], dict[str, float]]] = {}
    for run in runs:
        changes = params_changed({k: v for k, v in run.params.items() if k != "seed"}, baseline)
        if run.baseline != workspace.baseline:  # other code: not the same run at another seed
            changes.append(f"from commit {run.baseline[:7]}")
        if not changes:
            by_seed.setdefault(run.params.get("seed"), compared_numbers(run.metrics))
        else:
            others[run.name] = (changes, compared_numbers(run.metrics))
    return by_seed, others
