"""The git and DVC around a scheduled run: pull the code, run in a checkout of its own, record
the result as a DVC experiment and push it.

A scheduled run must not disturb the repository it serves: a person may be working in it,
and `params.yaml` there is theirs. So the run clones the repository's committed HEAD into
`.rlhf/runs/<name>` (inside the repository, so the stage containers, which mount only the
repository, see it), shares the repository's DVC cache, applies its overrides there as
`dvc exp run -S` would, saves the outcome with `dvc exp save` and pushes the experiment back:
its git ref to the repository (`dvc exp show` lists it there) and its data to the DVC remote.
Every path written into the checkout's DVC config is relative, so the checkout works whether
the repository is mounted at /workspace in a container or lives at its host path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from dvc.repo import Repo

from rlhf.errors import PipelineError

RUNS = Path(".rlhf") / "runs"  # checkouts of scheduled runs, inside the repository


class RepositoryError(PipelineError):
    """A git or DVC command the run depends on failed; the message is its own error line."""


def run_command(args: list[str], cwd: Path) -> str:
    """Run `args` in `cwd` and return its stdout; on failure, a RepositoryError with the
    command and its last error line."""
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=git_env())
    if done.returncode:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        last = said[-1] if said else f"exit status {done.returncode}"
        raise RepositoryError(f"`{' '.join(args)}` in {cwd} failed: {last}")
    return done.stdout


def git_env() -> dict[str, str]:
    """The environment, with a committer for `dvc exp save` where git has none configured
    (a container's user usually has no ~/.gitconfig)."""
    env = dict(os.environ)
    for role in ("AUTHOR", "COMMITTER"):
        env.setdefault(f"GIT_{role}_NAME", "rlhf-pipeline")
        env.setdefault(f"GIT_{role}_EMAIL", "rlhf-pipeline@localhost")
    return env


def pull_code(root: Path) -> str:
    """Fast-forward the repository's branch to its upstream, if it tracks one; a diverged or
    dirty branch fails the run rather than merging. Returns what happened, for the log."""
    upstream = subprocess.run(
        ["git", "rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{upstream}"],
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    if upstream.returncode:
        return "the branch tracks no upstream: running the checked-out commit"
    run_command(["git", "pull", "--ff-only", "--quiet"], root)
    return f"pulled {upstream.stdout.strip()}"


def head_commit(root: Path) -> str:
    return run_command(["git", "rev-parse", "HEAD"], root).strip()


def checkout_for_run(root: Path, name: str) -> Path:
    """A fresh clone of the repository's HEAD at `.rlhf/runs/<name>` that uses the
    repository's DVC cache and remotes (a local remote by a path relative to the clone)."""
    checkout = root / RUNS / name
    if checkout.exists():  # a run of this name that crashed: start over
        shutil.rmtree(checkout)
    checkout.parent.mkdir(parents=True, exist_ok=True)
    run_command(["git", "clone", "--quiet", "--local", ".", str(RUNS / name)], root)
    with Repo(str(root)) as repo:
        cache = Path(repo.cache.local_cache_dir)
        remotes = {n: r["url"] for n, r in repo.config["remote"].items() if is_path(r["url"])}
    config = checkout / ".dvc"
    lines = ["[cache]", f"    dir = {os.path.relpath(cache, config)}"]
    for remote, url in remotes.items():
        lines += [f"['remote \"{remote}\"']", f"    url = {os.path.relpath(url, config)}"]
    (config / "config.local").write_text("\n".join(lines) + "\n")
    return checkout


def is_path(url: str) -> bool:
    """A local directory remote (DVC has already made it absolute), not s3://, ssh://..."""
    return "://" not in url


def has_remote(checkout: Path) -> bool:
    with Repo(str(checkout)) as repo:
        return bool(repo.config["core"].get("remote"))


def pull_inputs(checkout: Path) -> None:
    """What the remote has of this commit's outputs, so that DVC skips the stages whose
    results were pushed before; outputs it lacks (a first run) are left for the stages."""
    run_command(["dvc", "pull", "--quiet", "--allow-missing"], checkout)


def record_experiment(checkout: Path, name: str, root: Path) -> str:
    """Save the checkout's state as DVC experiment `name`, push its outputs to the DVC
    remote (if one is configured) and its git ref to the repository; returns the
    experiment's commit."""
    run_command(["dvc", "exp", "save", "--quiet", "--force", "--name", name], checkout)
    if has_remote(checkout):
        run_command(["dvc", "push", "--quiet"], checkout)
    run_command(["dvc", "exp", "push", "--no-cache", "--force", "origin", name], checkout)
    refs = run_command(["git", "for-each-ref", "--format=%(objectname) %(refname)"], root)
    for line in refs.splitlines():
        commit, ref = line.split(" ", 1)
        if ref.startswith("refs/exps/") and ref.endswith(f"/{name}"):
            return commit
    raise RepositoryError(f"experiment {name} was pushed but {root} has no ref for it")


def remove_checkout(checkout: Path) -> None:
    shutil.rmtree(checkout, ignore_errors=True)
