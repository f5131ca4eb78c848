"""`key=value` params overrides, applied to params.yaml as `dvc exp run -S` applies them.

DVC's own error for a bad override is "Invalid `--set-param` value" (the reason sits in
Hydra's exception beneath it), and a typo in a key with `+` lands in params.yaml before any
check. Here each override is applied to a copy, Hydra's reason and the closest real key make
one line, and the result must pass the params schema before anything is written.
"""

from __future__ import annotations

import difflib
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import yaml
from dvc.exceptions import InvalidArgumentError
from dvc.utils.hydra import apply_overrides

from rlhf.atomic import write_text
from rlhf.params import Params, ParamsError, describe, parse_params


def with_overrides(params_file: Path, overrides: Sequence[str]) -> tuple[str, Params]:
    """`params_file`'s text with `overrides` applied (Hydra syntax, comments kept), and the
    params it holds, once they pass the schema; the file itself is left as it is."""
    parsed(params_file.read_text(), str(params_file))  # its own YAML first, named as itself
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / params_file.name
        shutil.copy(params_file, staged)
        for override in overrides:
            try:
                apply_overrides(staged, [override])
            except InvalidArgumentError as exc:
                raise ParamsError(refusal(override, exc.__cause__ or exc)) from None
        text = staged.read_text()
    source = f"{params_file} with -S {' '.join(overrides)}" if overrides else str(params_file)
    return text, parse_params(parsed(text, source), source)  # names a bad key and value


def parsed(text: str, source: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ParamsError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None


def refusal(override: str, reason: BaseException) -> str:
    """One line: the override, and why Hydra refused it (a key params.yaml lacks, with the
    closest key the schema has; or the syntax)."""
    key = override.split("=", 1)[0].lstrip("+~")
    said = str(reason).strip().splitlines()
    if said and said[0].startswith("Could not override"):
        keys = [name for name, _, _ in describe()]
        if key in keys:  # a key the schema has, at its default: DVC adds it only with +
            return f"-S {override}: params.yaml has no key {key} (at its default): -S +{override}"
        close = difflib.get_close_matches(key, keys, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"-S {override}: params.yaml has no key {key}{hint}"
    return f"-S {override}: {said[0] if said else 'not a valid override'}"


def set_params(params_file: Path, overrides: Sequence[str]) -> None:
    """Write `overrides` into params_file (as `dvc exp run -S` does), only if the result is
    valid; a crash leaves the old file whole."""
    if overrides:
        write_text(params_file, with_overrides(params_file, overrides)[0])
