"""The shipped params files are fixed points of DVC's `-S` rewrite (issue 47, item 4).

`dvc exp run -S key=value` (and `rlhf run -S`, through the same function) reads params.yaml
with ruamel's round trip, merges the overridden values in as plain Python objects and writes
the file back: a list comes back in block style and the blank line after a top-level list is
dropped (treeverse/dvc#8720). The shipped files are written in that style, so setting a value
that is already there leaves `git diff` empty, and setting another changes only its lines.
These tests call DVC's own `apply_overrides`, not a copy of it.
"""

import difflib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from dvc.utils.hydra import apply_overrides

from rlhf.params import load_params
from rlhf.project.overrides import with_overrides

from conftest import REPO

SHIPPED = ["params.yaml", *(str(p.relative_to(REPO)) for p in sorted(REPO.glob("examples/*.yaml")))]


def flat(values: dict, prefix: str = "") -> dict[str, object]:
    """`group.key` -> value, as `-S` names them."""
    out: dict[str, object] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def exponent(value: object) -> bool:
    """A float ruamel writes as Python's repr with an exponent (`1e-05`), not as the file has
    it (`0.00001`): PyYAML (YAML 1.1) would read that back as text, so the file keeps the
    decimal and `-S` of such a key rewrites its line (same number, other spelling)."""
    return isinstance(value, float) and "e" in repr(value)


def same_values(path: Path) -> list[str]:
    """An override for every key of the file, each to the value the file already holds."""
    values = flat(yaml.safe_load(path.read_text()))
    return [f"{key}={json.dumps(value)}" for key, value in values.items() if not exponent(value)]


def dvc_sets(tmp_path: Path, name: str, overrides: list[str]) -> tuple[str, str]:
    """The file's text before and after DVC applies `overrides` to a copy of it."""
    copy = tmp_path / Path(name).name
    shutil.copy(REPO / name, copy)
    before = copy.read_text()
    apply_overrides(copy, overrides)
    return before, copy.read_text()


def changed_lines(before: str, after: str) -> list[str]:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]


@pytest.mark.parametrize(
    "overrides",
    [
        ["seed=1234"],  # a scalar
        ["rl_algorithms=[ppo,grpo]"],  # the top-level list
        ["data.tasks=[greet,add,capital,repeat,refuse,uppercase]"],  # a list in a group
        ["ppo.kl_coef=0.5", "evaluate.temperatures=[0.3,0.5,0.7,1.0]", "model.bias=true"],
        ["device=auto", "evaluate.judges=[gold,rm]", "rl.ensemble=[]"],
    ],
    ids=["scalar", "top-level-list", "nested-list", "nested-keys", "strings-and-lists"],
)
def test_setting_a_value_params_yaml_holds_leaves_it_byte_identical(tmp_path, overrides):
    before, after = dvc_sets(tmp_path, "params.yaml", overrides)
    assert changed_lines(before, after) == []
    assert after == before


@pytest.mark.parametrize("name", SHIPPED)
def test_every_key_set_to_its_own_value_leaves_the_shipped_file_as_it_is(tmp_path, name):
    overrides = same_values(REPO / name)
    assert len(overrides) > 150  # every key, less the few small learning rates (see exponent)
    before, after = dvc_sets(tmp_path, name, overrides)
    assert changed_lines(before, after) == []
    assert after == before


def test_rlhf_run_s_with_the_same_values_gives_the_same_text():
    """`rlhf run -S` / `rlhf params -S` apply each override in turn through with_overrides."""
    path = REPO / "params.yaml"
    text, _ = with_overrides(path, ["seed=1234", "rl_algorithms=[ppo,grpo]", "ppo.kl_coef=0.5"])
    assert text == path.read_text()


def test_setting_another_value_changes_only_its_line_and_keeps_its_comment(tmp_path):
    before, after = dvc_sets(tmp_path, "params.yaml", ["ppo.kl_coef=0.05"])
    assert changed_lines(before, after) == [
        "-  kl_coef: 0.5          # KL penalty in every token's reward (0.2 over-optimizes here)",
        "+  kl_coef: 0.05         # KL penalty in every token's reward (0.2 over-optimizes here)",
    ]


def test_shortening_a_list_removes_only_its_items(tmp_path):
    before, after = dvc_sets(tmp_path, "params.yaml", ["rl_algorithms=[ppo]"])
    assert changed_lines(before, after) == ["-- grpo"]


def test_a_small_learning_rate_set_by_dvc_is_one_line_and_the_same_number(tmp_path):
    """The exception `exponent` names: DVC writes 0.00001 as `1e-05`, one line, which the
    params loader still reads as the same number."""
    name = "examples/gpt2-hh.params.yaml"
    before, after = dvc_sets(tmp_path, name, ["rm.lr=0.00001"])
    assert changed_lines(before, after) == ["-  lr: 0.00001", "+  lr: 1e-05"]
    assert load_params(tmp_path / Path(name).name) == load_params(REPO / name)
