"""The `rlhf` command: every stage, plus the tools users reach for between runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.table import Table

from rlhf import checkpoint
from rlhf.data import SFT_SCHEMA, DataError, write_rows
from rlhf.generation import SamplingConfig, generate_texts
from rlhf.importers import import_sft
from rlhf.params import ParamsError, describe
from rlhf.tokenizer import load_tokenizer
from rlhf.training import resolve_device
from stages import paths
from stages.common import console, progress

app = typer.Typer(
    help="InstructGPT-style RLHF pipeline. `dvc repro` runs every stage; these commands run "
    "one stage or use a checkpoint.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _run_stage(run: Callable[[], object]) -> None:
    try:
        run()
    except (ParamsError, DataError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc


@app.command()
def prepare() -> None:
    """Write the train/validation/held-out Parquet sets (stage `prepare`)."""
    from stages import prepare as stage

    _run_stage(stage.run)


@app.command()
def tokenizer() -> None:
    """Train or build the tokenizer (stage `tokenizer`)."""
    from stages import tokenizer as stage

    _run_stage(stage.run)


@app.command()
def sft() -> None:
    """Supervised fine-tuning on the demonstrations (stage `sft`); resumes if interrupted."""
    from stages import sft as stage

    _run_stage(stage.run)


@app.command()
def generate(
    checkpoint_path: Annotated[Path, typer.Argument(help="Policy checkpoint (.pt).")] = (
        paths.SFT_MODEL
    ),
    prompt: Annotated[list[str] | None, typer.Option("--prompt", "-p", help="A prompt.")] = None,
    file: Annotated[Path | None, typer.Option(help="A file of prompts, one per line.")] = None,
    greedy: Annotated[bool, typer.Option(help="Pick the most likely token.")] = False,
    temperature: Annotated[float, typer.Option(min=1e-3)] = 1.0,
    top_k: Annotated[int, typer.Option(min=0, help="0 keeps every token.")] = 0,
    top_p: Annotated[float, typer.Option(min=1e-6, max=1.0)] = 1.0,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 48,
    batch_size: Annotated[int, typer.Option(min=1)] = 64,
    seed: int = 0,
    tokenizer_dir: Annotated[Path, typer.Option("--tokenizer")] = paths.TOKENIZER,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
) -> None:
    """Answer prompts with a checkpoint: batched, with the KV cache."""
    prompts = list(prompt or [])
    if file is not None:
        prompts += [line for line in file.read_text().splitlines() if line.strip()]
    if not prompts:
        raise typer.BadParameter("give --prompt or --file")
    target = resolve_device(device)
    tok = load_tokenizer(tokenizer_dir)
    model, _ = checkpoint.load_model(checkpoint_path, tok, target)
    config = SamplingConfig(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        greedy=greedy,
    )
    generator = torch.Generator(target).manual_seed(seed)
    with progress() as bar:
        task = bar.add_task("generate", total=len(prompts), extra="")
        answers = generate_texts(
            model,
            tok,
            prompts,
            config,
            batch_size=batch_size,
            generator=generator,
            on_batch=lambda n: bar.update(task, advance=n),
        )
    if as_json:
        for p, a in zip(prompts, answers, strict=True):
            typer.echo(json.dumps({"prompt": p, "response": a}))
        return
    table = Table("prompt", "response", show_lines=True)
    for p, a in zip(prompts, answers, strict=True):
        table.add_row(p, a)
    console.print(table)


@app.command("import")
def import_data(
    source: Annotated[Path, typer.Argument(help="JSONL or Parquet with prompt, response.")],
    out: Annotated[Path, typer.Option(help="Where to write.")] = paths.RAW_SFT,
) -> None:
    """Validate demonstrations from your own file and write them for `data.source: files`."""
    try:
        rows = import_sft(source)
        write_rows(out, rows, SFT_SCHEMA)
    except DataError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    console.print(f"imported {len(rows)} rows into {out}; track it with `dvc add {out}`")


@app.command("params")
def show_params() -> None:
    """List every hyperparameter with its default and what it does."""
    table = Table("key", "default", "meaning")
    for key, doc, default in describe():
        table.add_row(key, json.dumps(default), doc)
    console.print(table)


if __name__ == "__main__":
    app()
