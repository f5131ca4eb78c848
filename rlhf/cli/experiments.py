"""Comparing runs: `rlhf seeds` (the pipeline at several seeds, as DVC experiments), `rlhf
compare` (every run against the seed spread) and `rlhf params` (every hyperparameter)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Annotated

import typer

from rlhf.cli.app import command, results, show_rows
from rlhf.errors import OptionError
from rlhf.params import describe, parse_params
from rlhf.params.schema import lookup
from rlhf.project import paths
from rlhf.project.drift import DEFAULT_STDS
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
    from rlhf.project.overrides import with_overrides

    overrides = set_params or []
    # ++: set where params.yaml leaves the seed at its default too
    for value in seed:  # refused before the first run: a typo in -S, a seed out of range
        with_overrides(paths.PARAMS, [*overrides, f"++seed={value}"])
    warn_of_uncommitted_params(Path.cwd())
    for value in seed:
        settings = [arg for o in [*overrides, f"++seed={value}"] for arg in ("-S", o)]
        console.print(f"seeds: dvc exp run --temp {' '.join(settings)}", markup=False)
        done = subprocess.run(["dvc", "exp", "run", "--temp", *settings])
        if done.returncode:  # DVC said why above
            print_error(f"dvc exp run at seed {value} exited {done.returncode}")
            raise typer.Exit(1)
    compare(as_json=False)


def warn_of_uncommitted_params(root: Path) -> None:
    """A line when params.yaml is not HEAD's: its seeds are then a variant's, which `rlhf
    compare` reads against the spread of HEAD's params, not as that spread."""
    from rlhf.eval.seeds import params_changed
    from rlhf.project.experiments import committed_params, read_params

    changed = params_changed(read_params(lambda path: (root / path).read_text()),
                             committed_params(root))  # fmt: skip
    if changed:
        console.print(f"seeds: params.yaml differs from HEAD's ({', '.join(changed)}): these "
                      "runs are that variant's, compared against HEAD's seeds; `git checkout "
                      "params.yaml` first for the default's spread", markup=False)  # fmt: skip


@command()
def compare(
    as_json: Annotated[bool, typer.Option("--json", help="The comparison as JSON.")] = False,
    baseline: Annotated[
        Path | None,
        typer.Option(
            help="A committed `rlhf compare --json` file (docs/seeds.json is the default's): "
            "read the workspace's run against its seed spread instead, a canary's verdict."
        ),
    ] = None,
    tolerance: Annotated[
        float,
        typer.Option(help="With --baseline: the band's half-width in standard deviations.", min=0),
    ] = DEFAULT_STDS,
) -> None:
    """The headline numbers of every run in this repository (the workspace and each DVC
    experiment) against their spread over the runs of the params HEAD commits at other seeds:
    mean ± standard deviation, and each other run's value marked `~` when it lies within two
    standard deviations of that mean (noise), `!` when outside. A workspace whose params.yaml
    differs from HEAD's (`dvc exp run -S` without `--temp`) is one of those other runs.

    With --baseline, the workspace's run alone against that file's spread: a table (number,
    baseline mean ± std, this run, verdict) and exit status 1 when any number drifted outside
    mean ± tolerance std (each std at least 0.02), as the scheduled pipeline's canary fails."""
    if baseline is not None:
        compare_with_baseline(baseline, tolerance, as_json)
        return
    from rlhf.eval.seeds import NOISE_STDS, spreads
    from rlhf.project.experiments import committed_params, recorded_runs, split_by_seed

    root = Path.cwd()
    runs = recorded_runs(root)
    by_seed, others = split_by_seed(runs, committed_params(root))
    spread = spreads(list(by_seed.values()))
    judged = len(by_seed) >= 2  # one seed has no spread to judge a difference against
    verdicts = {
        name: {k: spread[k].within_noise(v) for k, v in numbers.items() if judged and k in spread}
        for name, (_, numbers) in others.items()
    }
    if as_json:
        payload = {
            "baseline": {"commit": runs[0].baseline, "seeds": len(by_seed)},
            "seeds": {str(s): numbers for s, numbers in by_seed.items()},
            "spread": {k: vars(v) for k, v in spread.items()},
            "experiments": {
                name: {"changes": changes, "numbers": numbers, "within_noise": verdicts[name]}
                for name, (changes, numbers) in others.items()
            },
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    commit = runs[0].baseline[:7]
    if judged:
        console.print(f"compare: the spread is over {len(by_seed)} seeds of the params HEAD "
                      f"({commit}) commits; ~ within {NOISE_STDS:g} std of their mean, ! outside",
                      markup=False)  # fmt: skip
    else:
        console.print(f"compare: {len(by_seed)} run(s) of the params HEAD ({commit}) commits, "
                      "so no spread to judge a difference by: `rlhf seeds 1 2` adds two seeds",
                      markup=False)  # fmt: skip
    header = [f"over {len(by_seed)} seed(s): mean ± std (min – max)"]
    header += [f"{name} ({', '.join(changes)})" for name, (changes, _) in others.items()]
    rows = []
    for key, s in spread.items():
        cells = [f"{s.mean:.3f} ± {s.std:.3f} ({s.low:.3f} – {s.high:.3f})"]
        for name, (_, numbers) in others.items():
            value, within = numbers.get(key), verdicts[name].get(key)
            mark = "" if within is None else (" ~" if within else " !")
            cells.append("–" if value is None else f"{value:.3f}{mark}")
        rows.append([key, *cells])
    show_rows(["metric", *header], rows)


def compare_with_baseline(baseline: Path, tolerance: float, as_json: bool) -> None:
    """`rlhf compare --baseline`: the workspace's run against a baseline's spread."""
    from rlhf.project import drift

    verdict = drift.check(Path.cwd(), baseline, tolerance)
    rows, reason = verdict.rows(), verdict.reason()
    if as_json:
        typer.echo(json.dumps({"reason": reason, "rows": rows}, indent=2))
    else:
        show_rows(list(rows[0]), [list(row.values()) for row in rows])
    if verdict.failures:
        print_error(reason)
        raise typer.Exit(1)
    console.print(f"compare: {reason}", markup=False)


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
    from rlhf.project.overrides import with_overrides

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


@command()
def verify(
    stages: Annotated[
        list[str] | None,
        typer.Argument(help="Stages to replay as dvc.yaml names them (rl@ppo); all by default."),
    ] = None,
) -> None:
    """A replay certificate: each stage runs again from the inputs dvc.lock records, in a
    scratch copy of the workspace (the outputs checked out of the DVC cache; your files and
    cache are not written), and every output's hash is compared with dvc.lock's: one line per
    output, with the first differing keys of a metrics file. Exit status 0 only when every
    output is identical; first it says what bit-identity needs and where this machine differs
    from the recording one."""
    from rlhf.params import load_params
    from rlhf.project import verify as replaying
    from rlhf.stages.support.launch import NPROC_ENV

    root = Path.cwd()
    settings = load_params(root / paths.PARAMS)
    processes = os.environ.get(NPROC_ENV, "1")  # as the stages will run: a number or `auto`
    lines = replaying.machine_lines(root, settings.threads, settings.cpu_kernels, processes)
    for line in lines:
        console.print(f"verify: {line}", markup=False)
    replays = replaying.replay(
        root, stages or [], lambda stage: console.print(f"verify: replaying {stage}", markup=False)
    )
    for replayed in replays:
        if replayed.not_replayable:
            typer.echo(f"{replayed.stage}: NOT REPLAYED: {replayed.not_replayable}")
        for output in replayed.outputs:
            typer.echo(f"{replayed.stage}: {output.line()}")
    differing = [r.stage for r in replays if not r.identical]
    if differing:
        print_error(f"not identical to dvc.lock's record: {', '.join(differing)}")
        raise typer.Exit(1)
    outputs = sum(len(r.outputs) for r in replays)
    console.print(f"verify: all {outputs} outputs of {len(replays)} stages identical", markup=False)


@command()
def reproduced() -> None:
    """Whether this checkout's outputs are the committed ones, after the README's `dvc repro`:
    on the CPU that made them (docs/committed-cpu.json), git must see no file changed; on any
    other, where float rounding makes the run another seed's in effect, every headline number
    must lie within the committed seed spread (docs/seeds.json). CI runs the same check.
    Exit status 1 when it fails, with a line for each difference."""
    from rlhf.project import reproduction

    verdict = reproduction.check(Path.cwd())
    console.print(f"reproduced: checking the {verdict.check} ({verdict.why})", markup=False)
    for line in verdict.table:
        typer.echo(line)
    if verdict.bytes:
        console.print(f"reproduced: {verdict.bytes}", markup=False)
    for failure in verdict.failures:
        console.print(f"  {failure}", markup=False)
    if verdict.failures:
        print_error(f"{len(verdict.failures)} difference(s) from the committed outputs")
        raise typer.Exit(1)
    console.print(f"reproduced: yes, by the {verdict.check}", markup=False)
