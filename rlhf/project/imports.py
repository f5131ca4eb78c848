"""Which of the project's source files a stage runs: the closure of its module's imports.

Every `import` and `from ... import` anywhere in a module counts (inside functions too, so a
lazy import is no blind spot), except under `if TYPE_CHECKING:`, which never runs; so does the
`__init__.py` of every package on the way, which Python runs on the first import beneath it.
dvc.yaml lists a stage's closure as its code dependencies, so a change to any file a stage runs
reruns that stage, and only those stages.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import rlhf

ROOT_PACKAGE = "rlhf"
# the repository root: where `rlhf/` lives, and what dvc.yaml's paths are relative to
SOURCE_ROOT = Path(rlhf.__file__).resolve().parent.parent


def module_file(module: str, root: Path = SOURCE_ROOT) -> Path | None:
    """The file that defines `module` (relative to root), or None when it is not a module of
    this project."""
    if module != ROOT_PACKAGE and not module.startswith(f"{ROOT_PACKAGE}."):
        return None
    base = Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if (root / candidate).is_file():
            return candidate
    return None


def _package_inits(module: str, root: Path) -> set[Path]:
    """The `__init__.py` of `module`'s package and of every package above it."""
    parts = module.split(".")
    found = set()
    for depth in range(1, len(parts)):
        init = module_file(".".join(parts[:depth]), root)
        if init is not None:
            found.add(init)
    return found


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of the tree except those under `if TYPE_CHECKING:`."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


def imported_modules(file: Path, module: str) -> set[str]:
    """Names of the modules `file` (the source of `module`) imports, with `from pkg import x`
    counted as both `pkg` and `pkg.x` (x may be a submodule)."""
    tree = ast.parse(file.read_text(), filename=str(file))
    is_package = file.name == "__init__.py"
    names: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


@cache
def code_closure(module: str, root: Path = SOURCE_ROOT) -> tuple[Path, ...]:
    """Every project source file that running `module` imports, itself included; sorted
    paths relative to `root`."""
    found: set[Path] = set()
    pending = [module]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        file = module_file(name, root)
        if file is None:
            continue
        found.add(file)
        found.update(_package_inits(name, root))
        pending.extend(imported_modules(root / file, name) - seen)
    return tuple(sorted(found))
