"""The Typer app every command group registers on, and how a command reports failure: one
`error:` line and exit status 2 for a failure the user can fix (`rlhf.stages.support.entry`)."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rlhf.stages.support.entry import DEBUG_ENV, report_errors

# results (tables of answers, scores, params) go to stdout, for pipes; logs, progress and
# errors go to stderr (`rlhf.stages.support.common.console`)
results = Console(highlight=False)

app = typer.Typer(
    help="InstructGPT-style RLHF pipeline. `dvc repro` runs every stage; these commands run "
    "one stage or use a checkpoint.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def options(
    debug: Annotated[
        bool, typer.Option("--debug", help=f"Show tracebacks (as {DEBUG_ENV}=1 does).")
    ] = False,
) -> None:
    if debug:
        os.environ[DEBUG_ENV] = "1"


def command(
    name: str | None = None, help_text: str | None = None
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """`app.command`, with a failure the user can fix reported as one line, exit status 2;
    the help is `help_text`, else the function's docstring."""

    def register(function: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(function)
        def guarded(*args: object, **kwargs: object) -> None:
            status = report_errors(lambda: function(*args, **kwargs))
            if status:
                raise typer.Exit(status)

        return app.command(name, help=help_text or unwrapped(function.__doc__))(guarded)

    return register


def unwrapped(docstring: str | None) -> str | None:
    """A docstring as help text: each paragraph one line, for the terminal to wrap (the
    docstring's own line breaks would show in `rlhf --help`)."""
    if docstring is None:
        return None
    paragraphs = inspect.cleandoc(docstring).split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)


def show_rows(header: list[str], rows: list[list[str]]) -> None:
    """A table on a terminal; tab-separated lines elsewhere, for grep and scripts."""
    if not results.is_terminal:
        for row in [header, *rows]:
            print("\t".join(row))
        return
    table = Table(*header)
    for row in rows:
        table.add_row(*row)
    results.print(table)
