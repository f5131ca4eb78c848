"""The git and DVC around a scheduled run: fetch the code, run in a checkout of its own, record
the result as a DVC experiment and push it.

A scheduled run must not disturb the repository it serves: a person may be working in it, and
its branch, `params.yaml` and outputs are theirs. So the run fetches the branch's upstream (if
it tracks one) without touching the working tree, clones the commit to run (the upstream's,
else HEAD) into `.rlhf/runs/<name>` (inside the repository, so the stage containers, which
mount only the repository, see it), shares the repository's DVC cache, remotes and local DVC
settings, applies its overrides there as `dvc exp run -S` would, pushes its outputs (and DVC's
run cache) to the remote and saves the outcome with `dvc exp save`, pushing the experiment's
git ref back to the repository, where `dvc exp show` lists it. Every path written into the
checkout's DVC config is relative, so the checkout works whether the repository is mounted at
/workspace in a container or lives at its host path.
"""

from __future__ import annotations

import os
import re
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
    command and the line that says what went wrong (git's `error:`/`fatal:`, DVC's
    `ERROR:`), else its last line."""
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=git_env())
    if done.returncode:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        errors = [line for line in said if re.match(r"(error|fatal|ERROR):", line)]
        line = (errors or said or [f"exit status {done.returncode}"])[0 if errors else -1]
        raise RepositoryError(f"`{' '.join(args)}` in {cwd} failed: {line.strip()}")
    return done.stdout


def git_env() -> dict[str, str]:
    """The environment, with a committer for `dvc exp save` where git has none configured
    (a container's user usually has no ~/.gitconfig) and no prompt for credentials (nobody
    is there to answer it)."""
    env = dict(os.environ)
    env["GIT_TERMINAL_PROMPT"] = "0"
    for role in ("AUTHOR", "COMMITTER"):
        env.setdefault(f"GIT_{role}_NAME", "rlhf-pipeline")
        env.setdefault(f"GIT_{role}_EMAIL", "rlhf-pipeline@localhost")
    return env


def commit_to_run(root: Path) -> tuple[str, str]:
    """The commit a scheduled run runs, and what was done to find it (for the log): the
    upstream's head, fetched, where the branch tracks one; else HEAD. The working tree and
    the branch stay as they are."""
    if subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", "HEAD"], cwd=root, capture_output=True
    ).returncode:
        raise RepositoryError(f"{root} has no commit yet: commit the project first")
    upstream = subprocess.run(
        ["git", "rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{upstream}"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if upstream.returncode:
        return head_commit(root), "no upstream to fetch (a detached HEAD or a local branch)"
    run_command(["git", "fetch", "--quiet"], root)
    name = upstream.stdout.strip()
    return run_command(["git", "rev-parse", "@{upstream}"], root).strip(), f"fetched {name}"


def head_commit(root: Path) -> str:
    return run_command(["git", "rev-parse", "HEAD"], root).strip()


def valid_experiment_name(name: str, root: Path) -> str:
    """`name` made safe for a git ref (what DVC keeps an experiment as), checked by git."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    run_command(["git", "check-ref-format", f"refs/exps/{safe}"], root)
    return safe


def sweep_checkouts(root: Path) -> None:
    """Remove the checkouts of earlier runs that died before cleaning up (call it holding
    the repository: no run of it is under way)."""
    shutil.rmtree(root / RUNS, ignore_errors=True)


def checkout_for_run(root: Path, name: str, commit: str) -> Path:
    """A fresh clone of `commit` at `.rlhf/runs/<name>` that uses the repository's DVC cache,
    remotes and local DVC settings; DVC writes the paths relative to the clone's config."""
    checkout = root / RUNS / name
    checkout.parent.mkdir(parents=True, exist_ok=True)
    run_command(
        ["git", "clone", "--quiet", "--local", "--no-checkout", ".", str(RUNS / name)], root
    )
    run_command(["git", "checkout", "--quiet", "--detach", commit], checkout)
    with Repo(str(root)) as repo:
        cache = Path(repo.cache.local_cache_dir)
        local = repo.config.read("local")  # credentials, remotes set with --local, ...
        remotes = {n: r["url"] for n, r in repo.config["remote"].items() if is_path(r["url"])}
        default = repo.config["core"].get("remote")
    with Repo(str(checkout)) as clone, clone.config.edit("local") as config:
        config.update({section: values for section, values in local.items() if values})
        config["cache"]["dir"] = str(cache)
        for remote, url in remotes.items():
            config["remote"].setdefault(remote, {})["url"] = url
        if default:
            config["core"]["remote"] = default
    # DVC writes remote paths relative to the config, the cache's as given: make it relative
    config_file = checkout / ".dvc" / "config.local"
    relative = os.path.relpath(cache, config_file.parent)
    config_file.write_text(config_file.read_text().replace(f"= {cache}\n", f"= {relative}\n"))
    return checkout


def is_path(url: str) -> bool:
    """A local directory remote (DVC has already made it absolute), not s3://, ssh://..."""
    return "://" not in url


def has_remote(checkout: Path) -> bool:
    with Repo(str(checkout)) as repo:
        return bool(repo.config["core"].get("remote"))


def pull_inputs(checkout: Path) -> None:
    """What the remote has of this commit's outputs, and DVC's run cache, so that DVC skips
    every stage whose results were pushed before, here or on another host; outputs it lacks
    (a first run) are left for the stages."""
    run_command(["dvc", "pull", "--quiet", "--allow-missing", "--run-cache"], checkout)


def push_outputs(checkout: Path) -> None:
    run_command(["dvc", "push", "--quiet", "--run-cache"], checkout)


def untracked_files(checkout: Path) -> list[str]:
    """What the run wrote that the experiment must keep but git does not track yet: the
    outputs DVC leaves to git (`cache: false`: metrics, plots) and the `.gitignore` files DVC
    wrote beside new outputs. `dvc exp save` keeps untracked files only when named; without
    those `.gitignore`s, `dvc exp apply` would leave the models it checks out for `git add` to
    pick up. Anything else untracked (a stray file) stays out."""
    with Repo(str(checkout)) as repo:
        kept_by_git = [
            os.path.relpath(out.fs_path, checkout) for out in repo.index.outs if not out.use_cache
        ]
    listed = run_command(["git", "ls-files", "--others", "--exclude-standard", "-z"], checkout)
    return [
        path for path in listed.split("\0") if path
        and (Path(path).name == ".gitignore"
             or any(path == out or path.startswith(f"{out}/") for out in kept_by_git))
    ]  # fmt: skip


def record_experiment(checkout: Path, name: str, root: Path) -> str:
    """Save the checkout's state as DVC experiment `name` and push the experiment's git ref
    to the repository; returns the experiment's commit."""
    named = [f"--include-untracked={path}" for path in untracked_files(checkout)]
    run_command(["dvc", "exp", "save", "--quiet", "--force", "--name", name, *named], checkout)
    run_command(["dvc", "exp", "push", "--no-cache", "--force", "origin", name], checkout)
    refs = run_command(["git", "for-each-ref", "--format=%(objectname) %(refname)"], root)
    for line in refs.splitlines():
        commit, ref = line.split(" ", 1)
        if ref.startswith("refs/exps/") and ref.endswith(f"/{name}"):
            return commit
    raise RepositoryError(f"experiment {name} was pushed but {root} has no ref for it")


def remove_checkout(checkout: Path) -> None:
    shutil.rmtree(checkout, ignore_errors=True)
