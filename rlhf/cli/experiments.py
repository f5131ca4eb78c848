"""Comparing runs: `rlhf seeds` (the pipeline at several seeds, as DVC experiments), `rlhf
compare` (every run against the seed spread) and `rlhf params` (every hyperparameter)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Annotated

import typer

from rlhf.cli.app import command, results, show_rows
from rlhf.errors import OptionError
from rlhf.params import describe, lookup, parse_params
from rlhf.stages.support import paths
from rlhf.stages.support.common import console
from rlhf.stages.support.entry import print_error


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
    from rlhf.stages.support.overrides import with_overrides

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
    from rlhf.stages.support.experiments import recorded_runs, split_by_seed

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
    from rlhf.stages.support.overrides import with_overrides

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
    rows = [
        (key, json.dumps(lookup(values, key)), json.dumps(default), doc)
        for key, doc, default in describe()
    ]
    show_rows(["key", "value", "default", "meaning"], rows)
