"""Each stage's code deps in dvc.yaml, checked against oracles that share nothing with the
generator (`rlhf.project.imports.code_closure`).

test_dvc.py compares dvc.yaml with `code_closure` itself, so a blind spot of the closure would
be in both and pass there: were it to skip imports inside function bodies, collect, rl and
evaluate would lose `rlhf/algorithms/transformers_scorer.py` and DVC would call their results
up to date after it changed. Here two oracles decide instead: the modules each stage really
imports when it runs on the tiny project, and a plain reading of every import statement in the
source, function bodies included (the lazy imports that run only under some params, such as
`hf:DIR` judges, which the tiny params never use).

The run that shows what each stage imports is `dvc repro --force` of the trained tiny project,
which is also the check that a rerun at the same params and seed changes nothing: one whole
pipeline serves both.
"""

from __future__ import annotations

import ast
import json
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

from conftest import REPO, TINY_PARAMS, clean_env, sh, stages_ran

PACKAGE = "rlhf"
TRACE_DIR = "RLHF_TEST_IMPORT_TRACE"
# A sitecustomize.py, which Python imports at start-up from PYTHONPATH (in place of any the
# interpreter has): in a stage process (`python -m rlhf.stages.NAME [ITEM]`, as DVC runs it, or
# a process started from one that runs its `__main__` again, such as a torchrun worker), at
# exit it writes {module name: its file} for every module the process imported, the one it ran
# included, to $RLHF_TEST_IMPORT_TRACE/NAME[@ITEM].PID.json.
TRACER = f"""
import atexit, json, os, sys

def _record():
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if spec is None or not spec.name.startswith("{PACKAGE}.stages."):
        return  # DVC itself, git hooks: no stage
    name = "@".join([spec.name.rsplit(".", 1)[1], *sys.argv[1:]])
    files = {{n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())}}
    files[spec.name] = spec.origin  # the stage's own module, which ran as __main__
    with open(os.path.join(os.environ["{TRACE_DIR}"], f"{{name}}.{{os.getpid()}}.json"), "w") as f:
        json.dump(files, f)

atexit.register(_record)
"""


def shipped_dvc_yaml() -> dict:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())


def stage_runs(dvc_yaml: dict) -> dict[str, tuple[list[str], list[str]]]:
    """Each stage as DVC runs it on the tiny params, by DVC's name, in pipeline order: its
    command's words and its deps. A foreach stage runs once per element of its params list."""
    runs = {}
    for name, stage in dvc_yaml["stages"].items():
        if "foreach" not in stage:
            runs[name] = (stage["cmd"].split(), stage["deps"])
            continue
        listed = stage["foreach"].removeprefix("${").removesuffix("}")
        for item in TINY_PARAMS[listed]:
            runs[f"{name}@{item}"] = (stage["do"]["cmd"].replace("${item}", item).split(),
                                      stage["do"]["deps"])  # fmt: skip
    return runs


def stage_module(command: list[str]) -> str:
    python, option, module, *_ = command
    assert (python, option) == ("python", "-m"), command
    return module


def source_file(module: str, root: Path) -> str | None:
    """The project file (relative to root) that defines `module`; None for another package's
    module, or a name that is no module (`from rlhf.errors import PipelineError`)."""
    if module.split(".")[0] != PACKAGE:
        return None
    path = Path(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if (root / candidate).is_file():
            return str(candidate)
    return None


def package_inits(file: str) -> set[str]:
    """The `__init__.py` of every package that holds `file`: Python runs each before it."""
    parents = Path(file).parents[:-1]  # rlhf/a/b.py: rlhf/a, rlhf
    return {str(folder / "__init__.py") for folder in parents}


@cache
def imports_anywhere(file: str, root: Path) -> set[str]:
    """The project files that `file`'s import statements name, wherever they stand (function
    bodies included), but those under `if TYPE_CHECKING:`, which never runs."""
    tree = ast.parse((root / file).read_text(), filename=file)
    never_run = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for statement in node.body
        for inner in ast.walk(statement)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in never_run:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{file}:{node.lineno}: a relative import this cannot read"
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {found for name in names if (found := source_file(name, root)) is not None}


def unlisted_imports(dvc_yaml: dict, root: Path) -> dict[str, dict[str, list[str]]]:
    """Per stage, the project files that its module or one of its code deps imports (anywhere
    in their source) and its deps omit, each with the files that import it. Deps closed under
    imports hold everything the stage can ever import, under any params."""
    unlisted = {}
    for name, stage in dvc_yaml["stages"].items():
        stage = stage.get("do", stage)
        deps = set(stage["deps"])
        importers: dict[str, list[str]] = {}
        main = source_file(stage_module(stage["cmd"].split()), root)
        for file in sorted({main} | {d for d in deps if d.startswith(f"{PACKAGE}/")}):
            for imported in imports_anywhere(file, root) | package_inits(file) | {file}:
                if imported not in deps:
                    importers.setdefault(imported, []).append(file)
        if importers:
            unlisted[name] = importers
    return unlisted


def test_every_file_a_stage_can_import_is_among_its_deps():
    """The lazy imports too: a module a stage imports only under some params (a transformers
    judge, a reward model folder) is code the stage runs all the same."""
    unlisted = unlisted_imports(shipped_dvc_yaml(), REPO)
    assert unlisted == {}, "deps in dvc.yaml omit project files the stage imports:\n" + "\n".join(
        f"  {stage}: {file} (imported by {', '.join(importers)})"
        for stage, files in unlisted.items()
        for file, importers in files.items()
    )


def test_a_lazy_import_left_out_of_the_deps_is_caught():
    """The check above is not vacuous on the case that matters: scorers.py imports
    transformers_scorer.py only inside a function, and dropping it from collect's deps fails."""
    shipped = shipped_dvc_yaml()
    lazy = "rlhf/algorithms/transformers_scorer.py"
    collect = shipped["stages"]["collect"]
    collect["deps"] = [dep for dep in collect["deps"] if dep != lazy]
    assert unlisted_imports(shipped, REPO).get("collect") == {lazy: ["rlhf/algorithms/scorers.py"]}


@dataclass(frozen=True)
class Rerun:
    """`dvc repro --force` of a committed copy of the trained tiny project."""

    project: Path
    runs: dict[str, tuple[list[str], list[str]]]  # each stage DVC should run: command, deps
    ran: set[str]  # the stages DVC's log says it ran
    imported: dict[str, dict[str, Path]]  # stage -> {project module: its file}, its processes'


@pytest.fixture(scope="module")
def rerun(trained_project, tmp_path_factory) -> Rerun:
    project = (tmp_path_factory.mktemp("rerun") / "project").resolve()
    shutil.copytree(trained_project, project, ignore=shutil.ignore_patterns("__pycache__"))
    sh(["git", "add", "-A"], project)
    sh(["git", "commit", "-qm", "first run"], project)
    tracer, trace = project.parent / "tracer", project.parent / "trace"
    tracer.mkdir()
    trace.mkdir()
    (tracer / "sitecustomize.py").write_text(TRACER)
    env = clean_env() | {"PYTHONPATH": str(tracer), TRACE_DIR: str(trace)}
    ran = stages_ran(sh(["dvc", "repro", "--force"], project, env))
    imported: dict[str, dict[str, Path]] = {}
    for out in trace.glob("*.json"):
        stage = out.name.split(".", 1)[0]
        modules = json.loads(out.read_text()).items()
        imported.setdefault(stage, {}).update(
            {m: Path(f).resolve() for m, f in modules if m.split(".")[0] == PACKAGE}
        )
    runs = stage_runs(yaml.safe_load((project / "dvc.yaml").read_text()))
    return Rerun(project, runs, ran, imported)


def test_every_project_file_a_stage_imports_when_it_runs_is_among_its_deps(rerun):
    """What the stage really ran, whoever imported it and however: no reading of the source
    decides it. Only the code the tiny params reach, so lazy imports that other params take
    (an `hf:DIR` judge) are the check above's."""
    assert set(rerun.imported) == set(rerun.runs) == rerun.ran
    elsewhere = {
        stage: {m: str(f) for m, f in modules.items() if not f.is_relative_to(rerun.project)}
        for stage, modules in rerun.imported.items()
    }
    assert not any(elsewhere.values()), f"project modules imported from elsewhere: {elsewhere}"
    imported = {
        stage: {str(f.relative_to(rerun.project)) for f in modules.values()}
        for stage, modules in rerun.imported.items()
    }
    for name, (command, _) in rerun.runs.items():  # the trace saw the stage's own code
        assert source_file(stage_module(command), rerun.project) in imported[name], name
    unlisted = {
        name: sorted(imported[name] - set(deps))
        for name, (_, deps) in rerun.runs.items()
        if imported[name] - set(deps)
    }
    assert unlisted == {}, "deps in dvc.yaml omit project files the stage imported:\n" + "\n".join(
        f"  {stage}: {', '.join(files)}" for stage, files in unlisted.items()
    )


def test_an_identical_rerun_changes_no_metric_and_no_lock_entry(rerun):
    """Every stage rerun with the same params and seed: every output, metrics and plots
    included, comes out byte for byte the same (speed goes to the untracked timings/), so
    `dvc metrics diff` has nothing to show and dvc.lock stays as it was."""
    assert rerun.ran == set(rerun.runs)
    assert json.loads(sh(["dvc", "metrics", "diff", "--json"], rerun.project)) == {}
    assert sh(["git", "diff", "--stat"], rerun.project) == ""  # dvc.lock, metrics and plots
    assert json.loads((rerun.project / "timings" / "sft.json").read_text())["tokens_per_s"] > 0
