"""The layers stay in their order: library -> stages -> flows and the CLI, never back."""

import ast
from pathlib import Path

import pytest

from rlhf.stages.support.imports import imported_modules
from rlhf.stages.support.stage_list import STAGES

from conftest import REPO

APPLICATION = ("rlhf.stages", "rlhf.flows", "rlhf.cli")


def modules() -> dict[str, Path]:
    found = {}
    for file in sorted((REPO / "rlhf").rglob("*.py")):
        parts = file.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = file
    return found


def layer(module: str) -> int:
    """0: the library, 1: stages, 2: flows and the CLI."""
    if module.startswith("rlhf.stages"):
        return 1
    return 2 if module.startswith(("rlhf.flows", "rlhf.cli")) else 0


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_module_imports_from_a_layer_above_it(module):
    file = modules()[module]
    above = {
        name
        for name in imported_modules(file, module)
        if name.startswith(APPLICATION) and layer(name) > layer(module)
    }
    assert not above, f"{module} (layer {layer(module)}) imports {sorted(above)}"


def test_stages_are_thin_io_around_library_calls():
    """Each stage's run() is a few dozen lines; the algorithms' math lives in the library."""
    for file in sorted((REPO / "rlhf" / "stages").glob("*.py")):
        for node in ast.parse(file.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == "run":
                assert node.end_lineno - node.lineno < 55, f"{file.name}: run() is long"


def imports() -> dict[str, set[str]]:
    """By module, the project's modules it imports (lazy imports too; not itself)."""
    found = modules()
    return {
        module: {name for name in imported_modules(file, module) if name in found} - {module}
        for module, file in found.items()
    }


def test_no_two_modules_import_each_other():
    graph = imports()
    mutual = sorted((a, b) for a, names in graph.items() for b in names if a < b and a in graph[b])
    assert not mutual, f"these modules import each other: {mutual}"


def test_params_imports_nothing_from_the_library_above_it():
    """params is read by every stage: what it imports, every stage depends on (dvc.yaml), so
    it validates judges by the light registry in reward_sources, not through eval/."""
    above = {
        name
        for name in imports()["rlhf.params"]
        if name.startswith(("rlhf.eval", "rlhf.algorithms", "rlhf.models"))
    }
    assert not above, f"rlhf.params imports {sorted(above)}"


def test_the_stage_list_is_the_stage_modules():
    """`rlhf/stages/support/stage_list.py` names every stage module and says of each what
    its module does: whether it runs data-parallel (`main(run, data_parallel=True)`) and
    whether it resumes (it keeps a resume state)."""
    stage_files = {f.stem for f in (REPO / "rlhf" / "stages").glob("*.py")} - {"__init__"}
    assert {stage.name for stage in STAGES} == stage_files
    for stage in STAGES:
        source = (REPO / "rlhf" / "stages" / f"{stage.name}.py").read_text()
        assert ("data_parallel=True" in source) == stage.data_parallel, stage.name
        assert ("resume" in source) == stage.resumes, stage.name
