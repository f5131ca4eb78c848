"""The `rlhf` command: every stage, plus the tools users reach for between runs.

Every command reports a failure the user can fix as one `error:` line and exit status 2
(`rlhf.stages.entry`); `rlhf --debug COMMAND` shows the traceback instead.
"""

from __future__ import annotations

import functools
import getpass
import inspect
import json
import os
import subprocess
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rlhf.data.import_formats import FORMATS
from rlhf.errors import (
    USER_ERROR,
    CheckpointError,
    OptionError,
    OutputError,
    PipelineError,
)
from rlhf.params import RL_ALGORITHMS, DataParams, describe, load_params, lookup, parse_params
from rlhf.stages import paths
from rlhf.stages.common import console, progress
from rlhf.stages.entry import DEBUG_ENV, print_error, report_errors

# results (tables of answers, scores, params) go to stdout, for pipes; logs, progress and
# errors go to stderr (`rlhf.stages.common.console`)
results = Console(highlight=False)


ImportKind = Enum("ImportKind", {name: name for name in FORMATS}, type=str)
DEMONSTRATIONS = ImportKind("sft")  # the one kind that holds demonstrations, not comparisons


class ImportedAs(str, Enum):
    demonstrations = "demonstrations"
    comparisons = "comparisons"


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


def command(name: str | None = None) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """`app.command`, with a failure the user can fix reported as one line, exit status 2."""

    def register(function: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(function)
        def guarded(*args: object, **kwargs: object) -> None:
            status = report_errors(lambda: function(*args, **kwargs))
            if status:
                raise typer.Exit(status)

        return app.command(name, help=unwrapped(function.__doc__))(guarded)

    return register


def unwrapped(docstring: str | None) -> str | None:
    """A docstring as help text: each paragraph one line, for the terminal to wrap (the
    docstring's own line breaks would show in `rlhf --help`)."""
    if docstring is None:
        return None
    paragraphs = inspect.cleandoc(docstring).split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)


@command()
def prepare() -> None:
    """Write the train/validation/held-out Parquet sets (stage `prepare`)."""
    from rlhf.stages import prepare as stage

    stage.run()


@command()
def tokenizer() -> None:
    """Train or build the tokenizer (stage `tokenizer`)."""
    from rlhf.stages import tokenizer as stage

    stage.run()


@command()
def sft() -> None:
    """Supervised fine-tuning on the demonstrations (stage `sft`); resumes if interrupted;
    RLHF_NPROC processes."""
    from rlhf.stages import launch
    from rlhf.stages import sft as stage

    launch.run_stage(stage.run, stage.__name__, [])


@command()
def collect() -> None:
    """Sample K answers per prompt from the SFT policy and rank them (stage `collect`)."""
    from rlhf.stages import collect as stage

    stage.run()


@command()
def rm() -> None:
    """Train the reward model on the ranked comparisons (stage `rm`); RLHF_NPROC processes."""
    from rlhf.stages import launch
    from rlhf.stages import rm as stage

    launch.run_stage(stage.run, stage.__name__, [])


@command()
def rl(
    algorithm: Annotated[
        str, typer.Argument(help=f"One of {', '.join(RL_ALGORITHMS)}; its params group in "
                            "params.yaml says how it optimizes.")
    ],
) -> None:  # fmt: skip
    """Optimize the SFT policy with an RL algorithm (stage `rl@ALGORITHM`); resumes;
    RLHF_NPROC processes."""
    from rlhf.stages import launch
    from rlhf.stages import rl as stage

    launch.run_stage(lambda: stage.run(algorithm), stage.__name__, [algorithm])


@command()
def dpo() -> None:
    """Direct preference optimization of the SFT policy on the comparisons (stage `dpo`);
    RLHF_NPROC processes."""
    from rlhf.stages import dpo as stage
    from rlhf.stages import launch

    launch.run_stage(stage.run, stage.__name__, [])


@command()
def evaluate() -> None:
    """Every policy on the held-out prompts: win rates, over-optimization, the report (stage
    `evaluate`)."""
    from rlhf.stages import evaluate as stage

    stage.run()


@command("dvc-yaml")
def dvc_yaml(
    check: Annotated[
        bool, typer.Option("--check", help="Only report whether dvc.yaml is up to date.")
    ] = False,
) -> None:
    """Generate dvc.yaml from the stage declarations, each stage's code deps from its imports."""
    from rlhf.stages import dvcfile

    raise typer.Exit(dvcfile.main(["--check"] if check else []))


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
    if open_report:
        typer.echo(path)
        typer.launch(str(path))
        return
    from rich.markdown import Markdown

    results.print(Markdown(path.read_text()))


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
) -> None:
    """The whole pipeline through the Prefect flow `rlhf-pipeline`; up-to-date stages are
    skipped as by `dvc repro`. Uses the Prefect server in PREFECT_API_URL (or the active
    Prefect profile), else a temporary local one whose history is kept in .rlhf/prefect/. A
    run started while another holds this repository waits for it."""
    os.environ.update(prefect_environment(dict(os.environ)))  # read when Prefect is imported
    from rlhf.flows.pipeline import REFUSED, pipeline

    state = pipeline(
        target=target,
        overrides=set_params or [],
        containerized=containerized,
        experiment=experiment,
        retries=retries,
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


@command()
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
    """Answer prompts with a policy checkpoint: batched, with the KV cache."""
    import torch

    from rlhf.data.importers import read_prompts
    from rlhf.data.tokenizer import load_tokenizer
    from rlhf.models import checkpoint
    from rlhf.sampling.generate import generate_texts
    from rlhf.sampling.sampler import SamplingConfig
    from rlhf.train.device import resolve_device

    prompts = list(prompt or [])
    if file is not None:
        prompts += read_prompts(file)
    if not prompts:
        raise OptionError("give prompts with --prompt or --file")
    target = resolve_device(device)
    tok = load_tokenizer(tokenizer_dir)
    model, payload = checkpoint.load_model(checkpoint_path, tok, target)
    if payload["kind"] == "reward":
        raise CheckpointError(
            f"{checkpoint_path} is a reward model, which scores answers rather than writing "
            "them; generate with a policy (artifacts/sft/model.pt, or an RL or DPO stage's), "
            "or score answers with `rlhf score`"
        )
    if max_new_tokens >= model.max_seq_len:
        raise OptionError(
            f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the model's "
            f"context of {model.max_seq_len} tokens"
        )
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
    results.print(table)


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
            help="What to write. Default: demonstrations for --kind sft, comparisons for the "
            "others; `--as demonstrations` on comparisons keeps each prompt's best answer "
            "(HH-RLHF's chosen) as an SFT demonstration.",
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
    from rlhf.data.importers import best_answers, import_file, write_rejected
    from rlhf.data.schemas import RANKED_SCHEMA, SFT_SCHEMA, write_rows

    from_sft = kind is DEMONSTRATIONS
    default_as = ImportedAs.demonstrations if from_sft else ImportedAs.comparisons
    is_sft = (imported_as or default_as) is ImportedAs.demonstrations
    if from_sft and not is_sft:
        raise OptionError("--as comparisons: demonstrations (--kind sft) cannot become comparisons")
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
        "data.source: files (and collect.labeler: rm:PATH, hf:DIR or human, as the gold judge "
        "scores only the task suite)"
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


@command()
def score(
    checkpoint_path: Annotated[Path, typer.Argument(help="Reward checkpoint (.pt).")] = (
        paths.RM_MODEL
    ),
    prompt: Annotated[list[str] | None, typer.Option("--prompt", "-p")] = None,
    response: Annotated[
        list[str] | None, typer.Option("--response", "-r", help="One per --prompt, in order.")
    ] = None,
    file: Annotated[
        Path | None, typer.Option(help="JSONL or Parquet with prompt, response columns.")
    ] = None,
    tokenizer_dir: Annotated[Path, typer.Option("--tokenizer")] = paths.TOKENIZER,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
) -> None:
    """Score prompt/response pairs with a reward model (0 = the average SFT demonstration)."""
    from rlhf.algorithms.reward_model import score as score_responses
    from rlhf.data.importers import import_file
    from rlhf.data.tokenizer import load_tokenizer
    from rlhf.models import checkpoint
    from rlhf.train.device import resolve_device

    prompts, responses = list(prompt or []), list(response or [])
    if len(prompts) != len(responses):
        raise OptionError(f"{len(prompts)} --prompt but {len(responses)} --response")
    if file is not None:
        rows = import_file(file, "sft").rows
        prompts += [r["prompt"] for r in rows]
        responses += [r["response"] for r in rows]
    if not prompts:
        raise OptionError("give --prompt/--response pairs or --file")
    tok = load_tokenizer(tokenizer_dir)
    model, payload = checkpoint.load_model(checkpoint_path, tok, resolve_device(device))
    if payload["kind"] != "reward":
        raise CheckpointError(
            f"{checkpoint_path} is a {payload['kind']} checkpoint, not a reward model"
        )
    rewards = score_responses(model, tok, prompts, responses, pooling=payload["pooling"]).tolist()
    std = payload["reward_std"] or 1.0
    if as_json:
        for p, r, value in zip(prompts, responses, rewards, strict=True):
            record = {"prompt": p, "response": r, "reward": value, "z": value / std}
            typer.echo(json.dumps(record))
        return
    table = Table("prompt", "response", "reward", "z (reward / std)", show_lines=True)
    for p, r, value in zip(prompts, responses, rewards, strict=True):
        table.add_row(p, r, f"{value:+.3f}", f"{value / std:+.2f}")
    results.print(table)


class ExportFormat(str, Enum):
    hf = "hf"


@command()
def export(
    model: Annotated[
        str,
        typer.Argument(
            help="A trained stage (sft, rm, dpo, ppo, grpo, reinforce, rloo) or a checkpoint (.pt)."
        ),
    ],
    out: Annotated[Path, typer.Argument(help="The folder to write; it must not exist.")],
    export_format: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            help="hf: a Hugging Face folder (config.json, model.safetensors, tokenizer files "
            "and chat template) that transformers and vLLM load.",
        ),
    ] = ExportFormat.hf,
    tokenizer_dir: Annotated[Path, typer.Option("--tokenizer")] = paths.TOKENIZER,
) -> None:
    """Write a trained policy (as a causal LM) or reward model (as a sequence classifier) as
    a model folder other tools load."""
    import torch

    from rlhf.data.tokenizer import load_tokenizer
    from rlhf.models import checkpoint
    from rlhf.models.hf import save_folder

    source = Path(model) if model.endswith(".pt") else paths.model_file(model)
    if out.exists():
        raise OutputError(f"{out} exists; export writes a new folder")
    tok = load_tokenizer(tokenizer_dir)
    policy, payload = checkpoint.load_model(source, tok, torch.device("cpu"))
    save_folder(policy, out, tok, reward_model=payload["kind"] == "reward")
    console.print(
        f"exported {source} ({payload['kind']}, {policy.num_params() / 1e6:.2f}M parameters) "
        f"to {out} as a Hugging Face {policy.name} folder"
    )


@command()
def seeds(
    seed: Annotated[list[int], typer.Argument(help="The seeds to run, e.g. 1 2 3.")],
    set_params: Annotated[
        list[str] | None,
        typer.Option("--set", "-S", help="key=value for every run, as `dvc exp run -S`."),
    ] = None,
) -> None:
    """Run the pipeline at each seed as a DVC experiment (`dvc exp run --temp -S seed=N`, one
    after the other, the workspace left as it is), then compare them (`rlhf compare`)."""
    from rlhf.stages.overrides import with_overrides

    overrides = set_params or []
    # ++: set where params.yaml leaves the seed at its default too
    for value in seed:  # refused before the first run: a typo in -S, a seed out of range
        with_overrides(paths.PARAMS, [*overrides, f"++seed={value}"])
    for value in seed:
        settings = [arg for o in [*overrides, f"++seed={value}"] for arg in ("-S", o)]
        console.print(f"seeds: dvc exp run --temp {' '.join(settings)}", markup=False)
        done = subprocess.run(["dvc", "exp", "run", "--temp", *settings])
        if done.returncode:  # DVC said why above
            print_error(f"dvc exp run at seed {value} exited {done.returncode}")
            raise typer.Exit(1)
    compare(as_json=False)


@command()
def compare(
    as_json: Annotated[bool, typer.Option("--json", help="The comparison as JSON.")] = False,
) -> None:
    """The headline numbers of every run in this repository (the workspace and each DVC
    experiment) against their spread over the runs that differ from the workspace only in
    seed: mean ± standard deviation, and each experiment's value marked `~` when it lies within
    two standard deviations of that mean (noise), `!` when outside."""
    from rlhf.eval.seeds import spreads
    from rlhf.stages.experiments import recorded_runs, split_by_seed

    by_seed, others = split_by_seed(recorded_runs(Path.cwd()))
    spread = spreads(list(by_seed.values()))
    if as_json:
        payload = {
            "seeds": {str(s): numbers for s, numbers in by_seed.items()},
            "spread": {k: vars(v) for k, v in spread.items()},
            "experiments": {
                name: {"changes": changes, "numbers": numbers,
                       "within_noise": {k: spread[k].within_noise(v)
                                        for k, v in numbers.items() if k in spread}}
                for name, (changes, numbers) in others.items()
            },
        }  # fmt: skip
        typer.echo(json.dumps(payload, indent=2))
        return
    header = [f"over {len(by_seed)} seed(s): mean ± std (min – max)"]
    header += [f"{name} ({', '.join(changes)})" for name, (changes, _) in others.items()]
    rows = []
    for key, s in spread.items():
        cells = [f"{s.mean:.3f} ± {s.std:.3f} ({s.low:.3f} – {s.high:.3f})"]
        for _, numbers in others.values():
            value = numbers.get(key)
            mark = "" if value is None else ("~" if s.within_noise(value) else "!")
            cells.append("–" if value is None else f"{value:.3f} {mark}")
        rows.append([key, *cells])
    if len(by_seed) < 2:
        console.print("compare: one seed only, so no spread yet: `rlhf seeds 1 2` adds two")
    show_rows(["metric", *header], rows)


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


@command("params")
def show_params(
    set_params: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            "-S",
            help="key=value, as `dvc exp run -S` would apply it; params.yaml is not changed.",
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Only check params.yaml with the overrides, as every stage does first: one "
            "line naming a bad key or value (and the key you may have meant), exit status 2.",
        ),
    ] = False,
) -> None:
    """Every hyperparameter: its value (params.yaml with the overrides), its default and what
    it does; tab-separated lines when the output is not a terminal, for grep."""
    from rlhf.stages.overrides import with_overrides

    overrides = set_params or []
    if paths.PARAMS.exists():
        values = with_overrides(paths.PARAMS, overrides)[1]
    elif overrides:
        raise OptionError(f"-S needs a {paths.PARAMS} to apply to; none is here")
    else:
        values = parse_params({})
    if check:
        with_what = f" with -S {' '.join(overrides)}" if overrides else ""
        said = "valid" if paths.PARAMS.exists() else "not here: every key at its default"
        results.print(f"{paths.PARAMS}{with_what}: {said}", markup=False)
        return
    rows = [(key, json.dumps(lookup(values, key)), json.dumps(default), doc)
            for key, doc, default in describe()]  # fmt: skip
    show_rows(["key", "value", "default", "meaning"], rows)


if __name__ == "__main__":
    app()
