"""Running the whole pipeline and reading its results: `rlhf run` (the Prefect flow), `rlhf
deploy` (its scheduled deployments) and `rlhf report`."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from rlhf.cli.app import command, results
from rlhf.errors import USER_ERROR, OutputError
from rlhf.project import paths
from rlhf.project.drift import DEFAULT_STDS
from rlhf.stages.support.common import console
from rlhf.stages.support.entry import print_error


@command()
def report(
    open_report: Annotated[
        bool, typer.Option("--open", help="Print the report's path and open it in a viewer.")
    ] = False,
) -> None:
    """Show the evaluation report (reports/eval.md) that `dvc repro` or `rlhf evaluate` wrote."""
    path = paths.REPORT.resolve()
    if not path.exists():
        raise OutputError(f"no report at {path}; run `dvc repro evaluate` (or `rlhf evaluate`)")
    from rlhf.project.reproduction import other_cpu_line

    if note := other_cpu_line(Path.cwd()):
        console.print(f"report: {note}", markup=False)
    if open_report:
        typer.echo(path)
        if not viewer_available():
            raise OutputError(f"no viewer to open {path} with here (no display): `rlhf report` "
                              "prints it in the terminal")  # fmt: skip
        typer.launch(str(path))
        return
    from rich.markdown import Markdown

    results.print(Markdown(path.read_text()))


def viewer_available() -> bool:
    """Whether `typer.launch` can open a file: always on macOS and Windows; on Linux and the
    BSDs only under a display with xdg-open, which elsewhere prints lines of noise and exits 0."""
    if sys.platform in ("darwin", "win32"):
        return True
    display = os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    return bool(display) and shutil.which("xdg-open") is not None


# Prefect's temporary server, where PREFECT_API_URL names none and the environment does not
# say otherwise: minutes to start (Prefect's 20 s failed on a busy 2-core machine) and no
# analytics (offline hosts).
TEMPORARY_SERVER = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}
PREFECT_HOME = Path(".rlhf") / "prefect"  # the repository's own Prefect home, git-ignored


def prefect_environment(environ: dict[str, str]) -> dict[str, str]:
    """What `rlhf run` sets for Prefect where `environ` does not set it: the temporary
    server's settings, and a Prefect home of the repository's own, so its temporary server's
    database (flow-run history) and result storage are not the one SQLite file every Prefect
    user of this $HOME shares ("database is locked" under concurrent runs). The user's Prefect
    profiles stay in effect (a profile's PREFECT_API_URL still picks their server)."""
    settings = dict(TEMPORARY_SERVER)
    if "PREFECT_HOME" not in environ:
        profiles = Path("~/.prefect/profiles.toml").expanduser()  # Prefect's default
        settings["PREFECT_PROFILES_PATH"] = str(profiles)
        settings["PREFECT_HOME"] = str(PREFECT_HOME.resolve())
    return {key: value for key, value in settings.items() if key not in environ}


def use_prefect_environment() -> None:
    """Set `prefect_environment` in this process, before Prefect is imported (it reads them
    then), and make the Prefect home: Prefect would make only its last folder, not .rlhf/
    above it, and warn that it failed in a fresh clone."""
    settings = prefect_environment(dict(os.environ))
    if "PREFECT_HOME" in settings:
        Path(settings["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    os.environ.update(settings)


@command("run")
def run_pipeline(
    target: Annotated[
        str, typer.Option(help="Last stage to run; the stages it depends on run first.")
    ] = "evaluate",
    set_params: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            "-S",
            help="key=value param override, as `dvc exp run -S` applies it (e.g. -S "
            "ppo.kl_coef=0.05): into params.yaml, or with --experiment into the run's own copy.",
        ),
    ] = None,
    containerized: Annotated[
        bool,
        typer.Option(help="Run each stage as a run of the rlhf-stage deployment (needs a worker)."),
    ] = False,
    experiment: Annotated[
        bool,
        typer.Option(
            help="As the nightly deployment runs: fetch the code, pull its DVC outputs, run in "
            "a checkout of its own, record a DVC experiment and push it; params.yaml stays as is."
        ),
    ] = False,
    retries: Annotated[int, typer.Option(min=0, help="Retries per stage; training resumes.")] = 1,
    baseline: Annotated[
        Path | None,
        typer.Option(
            help="A canary: a committed `rlhf compare --json` file (docs/seeds.json is the "
            "default's); the run fails, exit status 1, when a headline number leaves its "
            "seed spread by more than --tolerance standard deviations."
        ),
    ] = None,
    tolerance: Annotated[
        float, typer.Option(min=0, help="With --baseline: the band, in standard deviations.")
    ] = DEFAULT_STDS,
) -> None:
    """The whole pipeline through the Prefect flow `rlhf-pipeline`; up-to-date stages are
    skipped as by `dvc repro`. Uses the Prefect server in PREFECT_API_URL (or the active
    Prefect profile), else a temporary local one whose history is kept in .rlhf/prefect/. A
    run started while another holds this repository waits for it."""
    use_prefect_environment()
    from rlhf.flows.pipeline import REFUSED, pipeline

    state = pipeline(
        target=target,
        overrides=set_params or [],
        containerized=containerized,
        experiment=experiment,
        retries=retries,
        baseline=str(baseline) if baseline else None,
        tolerance_stds=tolerance,
        return_state=True,
    )
    if not state.is_completed():  # refused: a problem the user fixes (2); else a failure (1)
        print_error(f"rlhf-pipeline ended {state.name}: {state.message}")
        raise typer.Exit(USER_ERROR if state.name == REFUSED else 1)


@command()
def deploy(
    name: Annotated[
        list[str] | None,
        typer.Option(help="Only this deployment of prefect.yaml (rlhf-stage, rlhf-pipeline)."),
    ] = None,
    build: Annotated[
        bool, typer.Option(help="Build the image with prefect.yaml's build step first.")
    ] = False,
    push: Annotated[bool, typer.Option(help="Push the image to its registry first.")] = False,
    gpus: Annotated[
        int | None,
        typer.Option(
            min=-1,
            help="GPUs for each stage container instead of prefect.yaml's (0: a host without "
            "GPUs; -1: every GPU of the host).",
        ),
    ] = None,
) -> None:
    """Create the Docker work pool from docker-work-pool.json and register the deployments in
    prefect.yaml with the Prefect server in PREFECT_API_URL."""
    from rlhf.flows.deploy import deploy as register

    raise typer.Exit(register(Path.cwd(), name, build, push, gpus))
