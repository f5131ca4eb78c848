"""Bringing data in: `rlhf import` (your demonstrations and comparisons, validated row by
row) and `rlhf label` (people ranking sampled answers in the terminal)."""

from __future__ import annotations

import getpass
import os
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rlhf.cli.app import command
from rlhf.data.import_formats import FORMATS
from rlhf.errors import OptionError, OutputError, PipelineError
from rlhf.params import load_params
from rlhf.params.groups import DataParams
from rlhf.project import paths
from rlhf.stages.support.common import console

ImportKind = Enum("ImportKind", {name: name for name in FORMATS}, type=str)
DEMONSTRATIONS = ImportKind("sft")  # the default kind


class ImportedAs(str, Enum):
    demonstrations = "demonstrations"
    comparisons = "comparisons"


@command("import")
def import_data(
    source: Annotated[
        Path,
        typer.Argument(help="A .jsonl, .parquet or .json (one array, as Label Studio exports)."),
    ],
    kind: Annotated[
        ImportKind,
        typer.Option(help=" ".join(f"{name}: {rows}." for name, rows in FORMATS.items())),
    ] = DEMONSTRATIONS,
    imported_as: Annotated[
        ImportedAs | None,
        typer.Option(
            "--as",
            help="What to write. Default: demonstrations for --kind sft, gsm8k and qa, "
            "comparisons for the others; `--as demonstrations` on comparisons keeps each "
            "prompt's best answer (HH-RLHF's chosen) as an SFT demonstration.",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="A .parquet file, or a folder to write the default file name into. Default: "
            "data/raw/sft.parquet for demonstrations, data/raw/comparisons.parquet for "
            "comparisons."
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the output file if it exists.")
    ] = False,
    skip_bad_rows: Annotated[
        bool,
        typer.Option(
            "--skip-bad-rows",
            help="Import the valid rows, and write the others with their reasons beside the "
            "output (sft.rejected.jsonl beside sft.parquet), instead of stopping at the first "
            "bad row.",
        ),
    ] = False,
) -> None:
    """Validate your own data row by row and write it where the pipeline reads it."""
    from rlhf.atomic import publication
    from rlhf.data.importers import IMPORTERS, best_answers, import_file, write_rejected
    from rlhf.data.schemas import RANKED_SCHEMA, SFT_SCHEMA, write_rows

    from_sft = IMPORTERS[kind.value].schema is SFT_SCHEMA
    default_as = ImportedAs.demonstrations if from_sft else ImportedAs.comparisons
    is_sft = (imported_as or default_as) is ImportedAs.demonstrations
    if from_sft and not is_sft:
        raise OptionError(
            f"--as comparisons: demonstrations (--kind {kind.value}) cannot become comparisons"
        )
    default = paths.RAW_SFT if is_sft else paths.RAW_COMPARISONS
    target = import_target(out, default, force)
    imported = import_file(source, kind.value, skip_bad_rows)
    rows = best_answers(imported.rows) if is_sft and not from_sft else imported.rows
    rejected = target.with_name(f"{target.stem}.rejected.jsonl")
    preview = heldout_preview(rows) if is_sft else None  # before writing: it reads params.yaml
    with publication() as staged:  # the rows and the rejected rows, both or neither
        write_rows(staged[target], rows, SFT_SCHEMA if is_sft else RANKED_SCHEMA)
        if skip_bad_rows:
            write_rejected(staged[rejected], imported.rejected)
    skipped = (
        f"; rejected {len(imported.rejected)}, with their reasons in {rejected}"
        if skip_bad_rows
        else ""
    )
    console.print(f"imported {len(rows)} rows into {where_written(target)}{skipped}")
    if preview:
        console.print(preview)
    setting = (
        "data.source: files (and collect.labeler: rm:PATH, hf:DIR, check:EXTRACTOR or human, "
        "as the gold judge scores only the task suite)"
        if is_sft
        else "collect.source: files"
    )
    tracking = f"track it with `dvc add {target}` and " if inside_project(target) else ""
    console.print(f"{tracking}set {setting} in params.yaml")


def inside_project(path: Path) -> bool:
    """Whether `path` lies in the project, the working directory (links not followed: a
    data/raw linked to another disk is still the project's)."""
    return Path(os.path.abspath(path)).is_relative_to(Path.cwd())


def where_written(target: Path) -> Path:
    """The path to report: as typed inside the project, in full outside it."""
    return target if inside_project(target) else Path(os.path.abspath(target))


def heldout_preview(rows: list[dict]) -> str:
    """How many held-out prompts `prepare` will cut from these demonstrations, under this
    project's data params, said before anything trains."""
    from rlhf.data.splits import MIN_HELDOUT, split_sizes

    try:  # params.yaml's own data params; the schema's where it has none or is invalid
        data = load_params(paths.PARAMS).data if paths.PARAMS.exists() else DataParams()
    except PipelineError:
        data = DataParams()
    prompts = len({row["prompt"] for row in rows})
    heldout, val = split_sizes(prompts, data.val_fraction, data.heldout_fraction)
    if heldout + val >= prompts:
        return f"warning: {prompts} distinct prompts are too few for prepare to split"
    line = f"{prompts} distinct prompts: prepare will hold out {heldout} for evaluation"
    if heldout < MIN_HELDOUT:
        return f"warning: {line}, fewer than {MIN_HELDOUT}: every win rate's interval will be wide"
    return line


def import_target(out: Path | None, default: Path, force: bool) -> Path:
    """Where `rlhf import` writes: inside `out` if it is a folder (never replacing it), and
    over an existing file only with --force. Outside the project (the working directory) only
    a file named in full, in a folder that exists: `--out /` or a mistyped `../../x` would
    otherwise write where nobody looks, or create folders there."""
    target = default if out is None else out / default.name if out.is_dir() else out
    if not inside_project(target):
        if out is not None and out.is_dir():
            raise OutputError(
                f"--out {out} is a folder outside the project; to write there, name the file "
                f"(--out {out / default.name})"
            )
        if not target.parent.is_dir():
            raise OutputError(
                f"--out {out}: {target.parent} does not exist, and import creates no folders "
                "outside the project"
            )
    if target.is_dir():
        raise OutputError(f"{target} is a folder; name a .parquet file to write")
    if target.suffix != ".parquet":
        raise OutputError(f"{target}: the output must be a .parquet file")
    if target.exists() and not force:
        raise OutputError(f"{target} exists; pass --force to replace it")
    return target


@command()
def label(
    labeler: Annotated[
        str,
        typer.Option(help="Your name: your labels go to LABELS/NAME.parquet. Default: your login."),
    ] = "",
    queue: Annotated[
        Path, typer.Option(help="The queue `dvc repro` wrote (collect.labeler: human).")
    ] = paths.LABEL_QUEUE,
    labels: Annotated[
        Path, typer.Option(help="The labels folder, a DVC dep of the collect stage.")
    ] = paths.LABELS,
) -> None:
    """Rank sampled answers in the terminal, best first with ties (`B A=C D`); every label is
    saved at once, and the next session resumes at your first unlabeled item."""
    from rlhf.labeling.queue import read_queue
    from rlhf.labeling.terminal import label_queue

    if not queue.is_file():
        raise PipelineError(
            f"{queue}: no labeling queue; set collect.labeler: human in params.yaml, run "
            "`rlhf dvc-yaml` and `dvc repro`, which writes it"
        )
    if not labeler:
        try:
            labeler = getpass.getuser()
        except OSError:  # a container with neither USER nor a passwd entry
            raise PipelineError("no login name to label under; give --labeler NAME") from None
    label_queue(read_queue(queue), labels, labeler, Console(highlight=False))
