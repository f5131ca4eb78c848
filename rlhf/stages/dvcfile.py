"""dvc.yaml, generated from the stage declarations so that the two cannot drift apart.

Each stage's deps are its code closure (every project file it imports, `imports.py`) followed
by the data and artifacts it reads; its params, outs, metrics and plots come from `specs.py`.
`python -m rlhf.stages.dvcfile` (or `rlhf dvc-yaml`) rewrites dvc.yaml; `--check` only
reports whether the committed file is what the declarations generate.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import yaml

from rlhf.atomic import write_text
from rlhf.params import load_params
from rlhf.stages import paths
from rlhf.stages.folders import create_labels_folder, tracked_folders
from rlhf.stages.imports import SOURCE_ROOT, code_closure
from rlhf.stages.specs import ITEM, Plot, StageSpec

DVC_FILE = Path("dvc.yaml")
# every stage module, in pipeline order; each declares its SPEC
STAGE_MODULES = (
    "rlhf.stages.prepare",
    "rlhf.stages.tokenizer",
    "rlhf.stages.sft",
    "rlhf.stages.collect",
    "rlhf.stages.rm",
    "rlhf.stages.rl",
    "rlhf.stages.dpo",
    "rlhf.stages.evaluate",
)
HEADER = """\
# GENERATED from rlhf/stages/specs.py by `rlhf dvc-yaml`: edit the declarations there, not this
# file (a test fails when the two differ). prepare -> tokenizer -> sft -> collect -> rm -> rl@NAME
# for every NAME in params.yaml's rl_algorithms, and dpo beside them -> evaluate. Each stage's
# deps are every project module it imports plus the data it reads, and its params exactly the
# groups it reads, so `dvc repro` reruns a stage when, and only when, one of those changed.
"""
# dvc.yaml's top-level plots, drawn by `dvc plots show` beside the stages' own: the training
# curves are each trained stage's dvclive folder, every metric a plot of its own
TOP_LEVEL_PLOTS: list[dict[str, Any]] = [
    {
        "Over-optimization, gold and reward-model score against KL to SFT": {
            "template": "scatter",
            "x": "kl_to_sft",
            "x_label": "KL to the SFT policy (nats per answer)",
            "y_label": "score (gold 0-1, RM in std units)",
            "y": {"metrics/eval_overoptimization.csv": ["gold_score", "rm_score"]},
        }
    },
]


def top_level_plot_files() -> set[str]:
    """The files the top-level plots draw."""
    return {file for plot in TOP_LEVEL_PLOTS for spec in plot.values() for file in spec["y"]}


def declared_stages() -> dict[str, StageSpec]:
    """Every stage's declaration, by dvc.yaml name, in pipeline order."""
    specs = [importlib.import_module(module).SPEC for module in STAGE_MODULES]
    return {spec.name: spec for spec in specs}


def plot_entry(plot: Plot) -> dict[str, Any]:
    """A stage plot's dvc.yaml properties; a folder without `y` draws each file's last
    column (a dvclive TSV's metric) against `x`."""
    return {"cache": False, "x": plot.x} | ({"y": plot.y} if plot.y else {})


def stage_entry(
    spec: StageSpec, root: Path = SOURCE_ROOT, folders: tuple[Path, ...] = ()
) -> dict[str, Any]:
    """The dvc.yaml definition of one declared stage; `folders` are the pretrained or reward
    model folders outside the pipeline that params make it read (`folders.py`)."""
    inputs = (*spec.inputs, *folders)
    entry: dict[str, Any] = {
        "cmd": f"python -m {spec.module}" + (f" {ITEM}" if spec.foreach else ""),
        "deps": [str(p) for p in (*code_closure(spec.module, root), *inputs)],
        "params": list(spec.params),
    }
    # a file a top-level plot draws is a plain output here, or `dvc plots show` draws it twice
    titled = top_level_plot_files()
    drawn = [p for p in spec.plots if str(p.path) not in titled]
    plain = [{str(p.path): {"cache": False}} for p in spec.plots if str(p.path) in titled]
    # details are cached like models: an uncached out that is not a metric or plot would keep
    # the stage out of DVC's run cache
    outs = [*spec.outs, *([spec.details] if spec.details else [])]
    if outs or plain:
        entry["outs"] = [str(p) for p in outs] + plain
    if spec.metrics:
        entry["metrics"] = [{str(p): {"cache": False}} for p in spec.metrics]
    if drawn:
        entry["plots"] = [{str(p.path): plot_entry(p)} for p in drawn]
    return {"foreach": spec.foreach, "do": entry} if spec.foreach else entry


def render(root: Path = SOURCE_ROOT) -> str:
    folders = tracked_folders(load_params(paths.PARAMS)) if paths.PARAMS.is_file() else {}
    stages = {
        name: stage_entry(spec, root, folders.get(name, ()))
        for name, spec in declared_stages().items()
    }
    body = yaml.safe_dump({"stages": stages, "plots": TOP_LEVEL_PLOTS}, sort_keys=False, width=100)
    return HEADER + body


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if DVC_FILE.exists() and DVC_FILE.read_text() == text:
            return 0
        print(f"{DVC_FILE} differs from what the stages declare (their SPEC); run `rlhf dvc-yaml`")
        return 1
    write_text(DVC_FILE, text)
    print(f"wrote {DVC_FILE}")
    if paths.PARAMS.is_file() and create_labels_folder(load_params(paths.PARAMS)):
        print(f"created {paths.LABELS}/ for `rlhf label`; commit it with the labels to come")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
