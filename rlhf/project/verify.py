"""`rlhf verify`: a replay certificate. Each named stage runs again from its recorded inputs in
a scratch copy of the workspace, and every output's hash is compared with the one `dvc.lock`
records, so that "this committed result is what this code produces" is checked, not claimed.

The scratch copy holds the workspace's files (git's tracked and untracked-but-not-ignored
ones), the outputs `dvc.lock` records checked out of the repository's DVC cache, and any other
dep the lock names (a model folder of the user's). After a stage whose replay differed or
failed, the recorded outputs are checked out again, so every stage replays on the recorded
inputs (after an identical replay the scratch copy holds them already). DVC runs the stage
(`dvc repro --force --single-item --no-commit`: nothing is added to the cache) and writes the
hashes into the scratch copy's `dvc.lock`; the user's workspace, outputs and cache are never
written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlhf.errors import PipelineError
from rlhf.eval.metric_keys import flattened
from rlhf.project import paths
from rlhf.project.reproduction import COMMITTED_CPU

LOCK = Path("dvc.lock")


class VerifyError(PipelineError):
    """What keeps a replay from starting: no dvc.lock, a stage it does not record, recorded
    outputs the cache lacks."""


@dataclass(frozen=True)
class OutputCheck:
    """One output of a replayed stage against its record."""

    stage: str
    path: str
    recorded: str  # the md5 dvc.lock records
    replayed: str | None  # the replay's md5; None when the stage did not write it
    differing_keys: list[str] = field(default_factory=list)  # a JSON file's, first few

    @property
    def identical(self) -> bool:
        return self.recorded == self.replayed

    def line(self) -> str:
        if self.identical:
            return f"identical  {self.path}"
        if self.replayed is None:
            return f"DIFFERS    {self.path}: the replay did not write it"
        hashes = f"recorded {self.recorded[:8]}, replayed {self.replayed[:8]}"
        keys = ", ".join(self.differing_keys)
        return f"DIFFERS    {self.path} ({hashes})" + (
            f"; first differing keys: {keys}" * bool(keys)
        )


@dataclass(frozen=True)
class StageReplay:
    stage: str
    outputs: list[OutputCheck]
    not_replayable: str = ""  # why the stage's inputs are not the recorded ones, if they are not

    @property
    def identical(self) -> bool:
        return not self.not_replayable and all(o.identical for o in self.outputs)


def recording_machine(root: Path) -> tuple[str, dict[str, Any]] | None:
    """Where the record was made and what it ran on, as far as this checkout can tell: the
    committed CPU (docs/committed-cpu.json), else what a stage's timings file recorded (a run
    of this workspace's own): (where it was read, the CPU's signature plus processes)."""
    committed = root / COMMITTED_CPU
    if committed.is_file():
        return str(COMMITTED_CPU), json.loads(committed.read_text())
    for timings in sorted((root / paths.TIMINGS).glob("*.json")):
        recorded = json.loads(timings.read_text())
        if isinstance(recorded.get("cpu"), dict):
            found = recorded["cpu"] | {"processes": recorded.get("processes", 1)}
            return str(timings.relative_to(root)), found
    return None


def machine_lines(root: Path, threads: int, kernels: str, processes: str) -> list[str]:
    """What a bit-identical replay needs, and where this machine differs from the record."""
    from rlhf.cpu import cpu_signature

    lines = [
        "a replay is bit-identical only where the recording run's CPU (its signature: vendor, "
        f"model, vector instructions), `cpu_kernels` (params.yaml: {kernels}), torch, "
        f"`threads` (params.yaml: {threads}) and process count (here {processes}) are the same"
    ]
    recorded = recording_machine(root)
    if recorded is None:
        return [*lines, "no record of the machine that made the outputs: cannot tell"]
    where, machine = recorded
    here = cpu_signature(kernels) | {"processes": processes}
    differs = [
        f"{key} {machine[key]} there, {here.get(key)} here"
        for key in machine
        if str(machine[key]) != str(here.get(key))
    ]
    if not differs:
        return [*lines, f"this machine is the recording one's ({where})"]
    differences = "; ".join(differs)
    return [*lines, f"this machine differs from the recording one ({where}): {differences}"]


def read_lock(root: Path) -> dict[str, Any]:
    path = root / LOCK
    if not path.is_file():
        raise VerifyError(f"{path}: no such file: `dvc repro` records a run there first")
    # libyaml's loader where PyYAML has it: a whole pipeline's lock is thousands of lines
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    stages = (yaml.load(path.read_text(), Loader=loader) or {}).get("stages")
    if not isinstance(stages, dict) or not stages:
        raise VerifyError(f"{path}: records no stage")
    return stages


def stages_to_replay(lock: Mapping[str, Any], named: list[str]) -> list[str]:
    """The named stages (every recorded one when none is named), in the lock's order, which
    is dvc.yaml's: the pipeline's."""
    unknown = [s for s in named if s not in lock]
    if unknown:
        raise VerifyError(
            f"{LOCK} records no stage {', '.join(unknown)}; it records {', '.join(lock)}"
        )
    return [s for s in lock if not named or s in named]


def outs_of(lock: Mapping[str, Any], stage: str) -> dict[str, str]:
    """Output path -> md5, as the lock records the stage's outputs."""
    return {out["path"]: out.get("md5", "") for out in lock[stage].get("outs", [])}


def first_differing_keys(recorded: Path, replayed: Path, limit: int = 3) -> list[str]:
    """The first keys whose values differ between two JSON files (none for other files)."""
    if replayed.suffix != ".json" or not recorded.is_file() or not replayed.is_file():
        return []
    try:
        before = flattened("", json.loads(recorded.read_text()))
        after = flattened("", json.loads(replayed.read_text()))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return []
    keys = [k for k in dict.fromkeys([*before, *after]) if before.get(k) != after.get(k)]
    return keys[:limit]


def dvc(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["dvc", *args], cwd=cwd, capture_output=True, text=True)


def cache_dir(root: Path) -> Path:
    done = dvc(["cache", "dir"], root)
    if done.returncode:
        raise VerifyError(f"{root}: not a DVC repository ({done.stderr.strip()[-200:]})")
    return Path(done.stdout.strip())


def recorded_file(root: Path, cache: Path, path: str, md5: str) -> Path:
    """The recorded contents of an output: its cache object, or for an output DVC does not
    cache (`cache: false`: metrics files, which git holds) the workspace's file."""
    cached = cache / "files" / "md5" / md5[:2] / md5[2:]
    return cached if cached.is_file() else root / path


def workspace_files(root: Path) -> list[str]:
    """What git sees in the workspace: tracked files and untracked ones it does not ignore."""
    done = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        raise VerifyError(f"{root}: not a git repository: `rlhf verify` replays a git + DVC one")
    return [name for name in done.stdout.split("\0") if name and (root / name).is_file()]


@contextmanager
def scratch_copy(root: Path, lock: Mapping[str, Any], cache: Path) -> Iterator[Path]:
    """A copy of the workspace with the recorded outputs checked out of root's `cache`."""
    with tempfile.TemporaryDirectory(prefix="rlhf-verify-") as folder:
        scratch = Path(folder) / "workspace"
        for name in workspace_files(root):
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, scratch / name)
        # DVC runs in a git repository; the copy needs no history, only what git ignores
        subprocess.run(["git", "init", "-q"], cwd=scratch, check=True, capture_output=True)
        set_cache = dvc(["cache", "dir", "--local", str(cache)], scratch)
        if set_cache.returncode:
            raise VerifyError(f"dvc cache dir in the scratch copy: {set_cache.stderr.strip()}")
        restore_recorded(scratch, root)
        for stage in lock.values():  # deps outside git and the pipeline: a model folder
            for dep in stage.get("deps", []):
                source, target = root / dep["path"], scratch / dep["path"]
                if source.exists() and not target.exists():
                    copy = shutil.copytree if source.is_dir() else shutil.copy2
                    copy(source, target)
        yield scratch


def restore_recorded(scratch: Path, root: Path) -> None:
    """The recorded dvc.lock and every output it records, from the cache."""
    shutil.copy2(root / LOCK, scratch / LOCK)
    done = dvc(["checkout", "--force", "--quiet"], scratch)
    if done.returncode:
        said = done.stderr.strip().splitlines()
        raise VerifyError(
            f"the recorded outputs are not all in the DVC cache ({said[-1] if said else ''}): "
            "`dvc pull` them first"
        )


def changed_inputs(scratch: Path) -> dict[str, list[str]]:
    """Each stage's deps (code, params, data) that are not what dvc.lock recorded, by stage,
    with the recorded outputs checked out: one `dvc status` for every stage."""
    done = dvc(["status", "--json"], scratch)
    status = json.loads(done.stdout or "{}") if done.returncode == 0 else {}
    return {
        stage: [str(path) for entry in entries if isinstance(entry, dict)
                for path in entry.get("changed deps", {})]
        for stage, entries in status.items()
    }  # fmt: skip


def replay(
    root: Path, named: list[str], progress: Callable[[str], None] = lambda stage: None
) -> list[StageReplay]:
    """Each stage replayed from its recorded inputs, its outputs compared with the record."""
    lock = read_lock(root)
    stages = stages_to_replay(lock, named)
    cache = cache_dir(root)
    results = []
    with scratch_copy(root, lock, cache) as scratch:
        changed_by_stage = changed_inputs(scratch)
        recorded_state = True  # the scratch copy holds the recorded outputs
        for stage in stages:
            progress(stage)
            changed = changed_by_stage.get(stage)
            if changed:
                why = f"its inputs are not the recorded ones: {', '.join(changed)} changed"
                results.append(StageReplay(stage, [], why))
                continue
            if not recorded_state:
                restore_recorded(scratch, root)
            done = dvc(["repro", "--force", "--single-item", "--no-commit", stage], scratch)
            recorded_state = False
            if done.returncode:
                said = (done.stdout + done.stderr).strip().splitlines()
                why = f"the replay failed: {said[-1] if said else done.returncode}"
                results.append(StageReplay(stage, [], why))
                continue
            replayed = outs_of(read_lock(scratch), stage)
            checks = []
            for path, md5 in outs_of(lock, stage).items():
                new = replayed.get(path)
                recorded = recorded_file(root, cache, path, md5)
                keys = [] if new == md5 else first_differing_keys(recorded, scratch / path)
                checks.append(OutputCheck(stage, path, md5, new, keys))
            results.append(StageReplay(stage, checks))
            recorded_state = all(check.identical for check in checks)
    return results
