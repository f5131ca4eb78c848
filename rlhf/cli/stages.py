"""One command per pipeline stage, generated from the stage list (`rlhf prepare`, ...,
`rlhf rl ALGORITHM`), and `rlhf dvc-yaml`. A stage module is imported only when its command
runs, so `rlhf --help` imports no torch.

No `from __future__ import annotations` here: a foreach stage's argument is annotated with its
own help, which Typer must see evaluated (a string annotation cannot name the loop's stage)."""

import importlib
from collections.abc import Callable
from typing import Annotated

import typer

from rlhf.cli.app import command
from rlhf.project.stage_list import STAGES, StageEntry


def run_stage(stage: StageEntry, args: list[str]) -> None:
    """The stage's `run` with `args` (a foreach stage's element), in this process or, for a
    data-parallel stage, as the processes RLHF_NPROC asks for."""
    module = importlib.import_module(stage.module)
    if not stage.data_parallel:
        module.run(*args)
        return
    from rlhf.stages.support import launch

    launch.run_stage(lambda: module.run(*args), stage.module, args)


def stage_command(stage: StageEntry) -> Callable[..., None]:
    """The command that runs `stage`: with its element as an argument for a foreach stage."""
    if not stage.items:
        return lambda: run_stage(stage, [])

    def run_item(
        item: Annotated[str, typer.Argument(help=stage.item_help, metavar=stage.item_name)],
    ) -> None:
        run_stage(stage, [item])

    return run_item


for entry in STAGES:
    command(entry.name, entry.help())(stage_command(entry))


@command("dvc-yaml")
def dvc_yaml(
    check: Annotated[
        bool, typer.Option("--check", help="Only report whether dvc.yaml is up to date.")
    ] = False,
) -> None:
    """Generate dvc.yaml from the stage declarations, each stage's code deps from its imports."""
    from rlhf import dvcfile

    raise typer.Exit(dvcfile.main(["--check"] if check else []))
