"""The layers stay in their order: library -> the project's description -> stages -> flows, the
CLI and dvc.yaml's generator, never back."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf.project.imports import imported_modules
from rlhf.project.stage_list import STAGE_MODULES, STAGES

from conftest import REPO

# from the top down: what a module may import lies in its own layer or one below
LAYERS = (("rlhf.flows", "rlhf.cli", "rlhf.dvcfile"), ("rlhf.stages",), ("rlhf.project",))
APPLICATION = tuple(prefix for layer in LAYERS for prefix in layer)


def modules() -> dict[str, Path]:
    found = {}
    for file in sorted((REPO / "rlhf").rglob("*.py")):
        parts = file.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = file
    return found


def layer(module: str) -> int:
    """0: the library, 1: the project's description, 2: stages, 3: flows, the CLI and
    dvc.yaml's generator."""
    for depth, prefixes in enumerate(LAYERS):
        if module == prefixes or module.startswith(prefixes):
            return len(LAYERS) - depth
    return 0


def imported_by_name(file: Path) -> set[str]:
    """The modules `file` imports through `importlib.import_module`: the stages, the only
    modules anything imports by name (the stage list names them)."""
    calls = [
        node
        for node in ast.walk(ast.parse(file.read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "importlib.import_module"
    ]
    return set(STAGE_MODULES) if calls else set()


def all_imports(module: str) -> set[str]:
    file = modules()[module]
    return imported_modules(file, module) | imported_by_name(file)


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_module_imports_from_a_layer_above_it(module):
    above = {
        name
        for name in all_imports(module)
        if name.startswith(APPLICATION) and layer(name) > layer(module)
    }
    assert not above, f"{module} (layer {layer(module)}) imports {sorted(above)}"


def test_the_generator_that_imports_every_stage_by_name_sits_above_them():
    """dvc.yaml's generator reads each stage's SPEC through importlib: an arrow `import`
    statements do not show, counted here."""
    assert set(STAGE_MODULES) <= all_imports("rlhf.dvcfile")
    assert layer("rlhf.dvcfile") > layer("rlhf.stages.sft")


@pytest.mark.parametrize("package", ["rlhf.project", "rlhf.flows"])
def test_the_projects_description_and_the_flows_load_no_torch(package):
    """What the CLI's light commands, CI's check and dvc.yaml's description read, and what
    each Prefect flow-run process imports (every stage a pipeline dispatches is one, which
    runs the stage itself as a subprocess): every module of the package imported, neither
    torch nor matplotlib is. They would add 2 to 4 s and 0.8 s to each."""
    names = sorted(m for m in modules() if m.startswith(package))
    heavy = "sorted({'torch', 'matplotlib'} & sys.modules.keys())"
    code = f"import sys; import {', '.join(names)}; print({heavy})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr


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
        for module, names in imports().items()
        if module.startswith("rlhf.params")
        for name in names
        if name.startswith(("rlhf.eval", "rlhf.algorithms", "rlhf.models"))
    }
    assert not above, f"rlhf.params imports {sorted(above)}"


def test_the_stage_list_is_the_stage_modules():
    """`rlhf/project/stage_list.py` names every stage module and says of each what
    its module does: whether it runs data-parallel (`main(run, data_parallel=True)`) and
    whether it resumes (it keeps a resume state)."""
    stage_files = {f.stem for f in (REPO / "rlhf" / "stages").glob("*.py")} - {"__init__"}
    assert {stage.name for stage in STAGES} == stage_files
    for stage in STAGES:
        source = (REPO / "rlhf" / "stages" / f"{stage.name}.py").read_text()
        assert ("data_parallel=True" in source) == stage.data_parallel, stage.name
        assert ("resume" in source) == stage.resumes, stage.name


def test_rl_shares_batch_helpers_with_the_sft_loop_without_importing_it():
    """RL's experience and update take the batch order and device reads from
    `rlhf.train.batches`, not from the SFT loop that also uses them."""
    graph = imports()
    rl = sorted(m for m in graph if m.startswith("rlhf.algorithms.rl"))
    assert not [m for m in rl if "rlhf.train.loop" in graph[m]]
    assert "rlhf.train.batches" in graph["rlhf.algorithms.rl.trainer"]
