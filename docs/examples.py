"""The measured examples (params files in examples/ that change the default for one lever) in
README.md and docs/results.md, written from recorded runs at several seeds, so that no figure
stated of them can go stale.

    python docs/examples.py --record EXAMPLE REV [--seconds S]  # a finished run of the example
    python docs/examples.py            # rewrite the generated blocks
    python docs/examples.py --check    # exit 1 when a block is stale

REV is where the run's outputs are committed: a DVC experiment's name (`dvc exp run --temp -n
NAME`), its commit, or any git revision; the run's params must be the example's but for the
seed, and its dvc.lock must say every stage ran on them (not a run of part of the pipeline,
which leaves the other stages' metrics of the commit before). What is recorded
(docs/example-seeds.json, per example and seed) is what `rlhf compare` reads of a run (its
headline numbers), each policy's 95% intervals against SFT's baselines and the ceilings (from
its metrics/details/eval.json, read through DVC), and, where the run had the machine to
itself, how long it took.

Blocks: `example-NAME` (docs/results.md: the spread over seeds, then each of issue 45's targets
on the mean and at every seed, beside the default's mean, and each seed's interval) and
`examples` (README.md: a line per example).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import dvc.api
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results.py beside this file

import results
from results import ROOT, Compared, duration, markdown_table, name, number

from rlhf.eval.seeds import compared_numbers, params_changed, spreads
from rlhf.project import paths
from rlhf.project.experiments import read_params, read_run

RECORDED = ROOT / "docs" / "example-seeds.json"
EXAMPLES = ROOT / "examples"
README_BLOCK = "examples"
DECODING = (results.BEST_TEMPERATURE, results.GREEDY, results.BEST_OF_N)  # with an interval


def example_file(example: str) -> Path:
    return EXAMPLES / f"{example}.params.yaml"


def changes(params: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[str]:
    """`key=value` for each param that differs from the baseline's, the seed aside."""
    return [c for c in params_changed(params, baseline) if not c.startswith("seed=")]


def example_params(example: str) -> dict[str, Any]:
    return read_params(lambda _: example_file(example).read_text())


def example_changes(example: str) -> str:
    """What the example changes of the default (the workspace's params.yaml), as prose shows it."""
    default = read_params(lambda _: (ROOT / paths.PARAMS).read_text())
    return ", ".join(f"`{change}`" for change in changes(example_params(example), default))


def record(example: str, rev: str, seconds: float | None) -> str:
    """Add (or replace) the run at `rev` as its seed's run of `example`; returns the seed."""
    read = partial(read_at, rev)
    params, headline = read_run(read)
    differ = changes(params, example_params(example))
    if differ:
        raise SystemExit(f"{rev}: not a run of examples/{example}.params.yaml: {differ}")
    stale = stale_stages(yaml.safe_load(read(Path("dvc.lock"))), yaml.safe_load(read(paths.PARAMS)))
    if stale:
        raise SystemExit(
            f"{rev}: its dvc.lock says {', '.join(stale)} did not run on this run's params and "
            "inputs (a run of part of the pipeline): record a run of the whole pipeline"
        )
    details = json.loads(read(paths.details_file("eval")))
    policies = [p for p in details["kl_to_sft"] if p != results.SFT]
    intervals = {
        results.compared_key(p, c.metric): results.lookup(details, c.interval_key(p))
        for p in policies
        for c in DECODING
    }
    run = {
        "rev": rev,
        "numbers": compared_numbers(headline),
        "intervals": {key: found for key, found in intervals.items() if found is not None},
        "ceilings": details.get("ceiling", {}).get(results.JUDGE, {}),
    }
    if seconds is not None:
        run["seconds"] = round(seconds)
    seed = str(params["seed"])
    recorded = results.read_json(RECORDED) or {}
    runs = recorded.setdefault(example, {})
    runs[seed] = run
    recorded[example] = dict(sorted(runs.items(), key=lambda item: int(item[0])))
    RECORDED.write_text(json.dumps(dict(sorted(recorded.items())), indent=2) + "\n")
    return seed


def stale_stages(lock: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """The stages a dvc.lock records with params other than `params` (the run's params.yaml)
    or with a dependency other than the output another stage recorded: what a run of part of
    the pipeline leaves (`dvc exp run rm` keeps the policies' metrics of the commit before)."""
    stages = lock["stages"]
    produced = {out["path"]: out.get("md5") for s in stages.values() for out in s.get("outs", [])}
    stale = []
    for stage_name, stage in stages.items():
        locked = stage.get("params", {}).get(paths.PARAMS.name, {})
        moved_params = any(results.lookup(params, k) != v for k, v in locked.items())
        moved_inputs = any(
            dep["path"] in produced and dep.get("md5") != produced[dep["path"]]
            for dep in stage.get("deps", [])
        )
        if moved_params or moved_inputs:
            stale.append(stage_name)
    return stale


def read_at(rev: str, path: Path) -> str:
    """A file of the run committed at `rev`, through DVC where it is a cached output."""
    return dvc.api.read(str(path), repo=str(ROOT), rev=rev)


def compared(runs: Mapping[str, Mapping[str, Any]]) -> Compared:
    """The runs as `rlhf compare --json` gives seeds: each seed's numbers and their spread."""
    numbers = {seed: run["numbers"] for seed, run in runs.items()}
    spread = spreads(list(numbers.values()))
    return {"seeds": numbers, "spread": {k: dataclasses.asdict(s) for k, s in spread.items()}}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One target on an example's seeds: the mean, the lowest seed, and whether each meets it."""

    target: results.Target
    mean: float
    lowest: float

    @property
    def on_the_mean(self) -> bool:
        return self.mean >= self.target.threshold

    @property
    def at_every_seed(self) -> bool:
        return self.lowest >= self.target.threshold

    def short(self) -> str:
        """`PPO `win_t` 0.624`, `` `rm:acc` 0.787``: the target as prose names it, its mean."""
        policy, key = results.policy_of(self.target.key), self.target.key.partition(":")[2]
        shown = f"{name(policy)} `{key}`" if policy else f"`{self.target.key}`"
        return f"{shown} {number(self.mean)}"


def verdicts(seeds: Compared) -> list[Verdict]:
    """Issue 45's targets on the seeds that measured them."""
    found = []
    for target in results.targets():
        spread = seeds["spread"].get(target.key)
        if spread is not None:
            found.append(Verdict(target, spread["mean"], spread["low"]))
    return found


def interval_lines(runs: Mapping[str, Mapping[str, Any]], policies: Sequence[str]) -> list[str]:
    """Per decoding baseline, each policy's win rate and 95% interval at every seed, and whose
    interval lies wholly above 0.5 at every seed."""
    lines = []
    for comparison in DECODING:
        shown, every = [], []
        for p in policies:
            key = results.compared_key(p, comparison.metric)
            found = [(s, r["numbers"][key], r["intervals"].get(key)) for s, r in runs.items()]
            if any(rate is None or ci is None for _, rate, ci in found):
                continue
            cells = [
                f"{number(rate)} ({number(ci['low'])} – {number(ci['high'])}) at seed {s}"
                for s, rate, ci in found
            ]
            shown.append(f"{name(p)} {', '.join(cells)}")
            if all(ci["low"] > 0.5 for _, _, ci in found):
                every.append(name(p))
        if shown:
            lines.append(
                f"- **{comparison.title}**, 95% intervals: {'; '.join(shown)}. Whole interval "
                f"above 0.5 at every seed: {results.listed(every)}."
            )
    return [*lines, ""] if lines else []


def span(values: Sequence[float]) -> str:
    """`0.859 to 0.892`, or the one value where all are equal."""
    low, high = number(min(values)), number(max(values))
    return low if low == high else f"{low} to {high}"


def timing(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """The sentence on how long the runs timed alone took; empty where none was."""
    timed = {seed: run["seconds"] for seed, run in runs.items() if "seconds" in run}
    if not timed:
        return ""
    each = ", ".join(f"{duration(t)} (seed {seed})" for seed, t in timed.items())
    return f" Each whole run, alone on a 2-core CPU: {each}."


def example_block(
    example: str, runs: Mapping[str, Mapping[str, Any]], default: Compared | None
) -> str:
    """docs/results.md's block of one example: its spread over the seeds, the targets on the
    mean and at every seed beside the default's mean, each seed's intervals and ceilings."""
    seeds = compared(runs)
    policies = sorted(results.policy_of(key) for key in seeds["spread"] if key.endswith(":win_t"))
    default_spread = (default or {}).get("spread", {})
    rows = []
    for verdict in verdicts(seeds):
        theirs = default_spread.get(verdict.target.key)
        rows.append([
            f"{verdict.target.says}: `{verdict.target.key}` ≥ {verdict.target.threshold:.2f}",
            number(verdict.mean),
            number(verdict.lowest),
            "yes" if verdict.on_the_mean else "no",
            "yes" if verdict.at_every_seed else "no",
            "–" if theirs is None else number(theirs["mean"]),
        ])  # fmt: skip
    header = ["target", "mean", "lowest seed", "met on the mean", "at every seed", "the default's"]
    ceilings = {
        kind: [run["ceilings"][kind] for run in runs.values() if kind in run["ceilings"]]
        for kind in results.ANSWERS_OF_SFT
    }
    ceiling_said = [
        f"{span(found)} against SFT {results.ANSWERS_OF_SFT[kind]}"
        for kind, found in ceilings.items()
        if found
    ]
    lines = [
        f"**Over {len(runs)} seed{'s' if len(runs) > 1 else ''}** of "
        f"`examples/{example}.params.yaml` "
        f"({example_changes(example)} against the default; seeds "
        f"{', '.join(runs)}, recorded by `python docs/examples.py --record {example} REV` in "
        "docs/example-seeds.json): mean ± standard deviation (min – max), win rates by the "
        f"{results.JUDGE} judge, ties half.{timing(runs)}",
        "",
        *results.seeds_table(seeds),
        *markdown_table(header, rows),
        *interval_lines(runs, policies),
    ]
    if ceiling_said:
        lines.append(f"A perfect policy would win {'; '.join(ceiling_said)} (the ceilings).")
    return "\n".join(lines).rstrip("\n")


def readme_block(recorded: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """README.md's line per example: the targets it meets at every seed, on the mean only,
    and not at all."""
    lines = []
    for example, runs in recorded.items():
        found = verdicts(compared(runs))
        groups = (
            ("met at every seed", [v for v in found if v.at_every_seed]),
            ("on the mean only", [v for v in found if v.on_the_mean and not v.at_every_seed]),
            ("not met", [v for v in found if not v.on_the_mean]),
        )
        said = "; ".join(
            f"{label}: {', '.join(v.short() for v in group)}" for label, group in groups if group
        )
        lines.append(
            f"- `examples/{example}.params.yaml` ({example_changes(example)}), seeds"
            f" {', '.join(runs)}, means by the gold judge against issue 45's targets: "
            f"{said}.{timing(runs)}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report a stale block")
    parser.add_argument("--record", nargs=2, metavar=("EXAMPLE", "REV"), help="record a run")
    parser.add_argument("--seconds", type=float, help="how long the recorded run took alone")
    args = parser.parse_args(argv)
    if args.record:
        example, rev = args.record
        if not example_file(example).is_file():
            raise SystemExit(f"{example_file(example).relative_to(ROOT)} does not exist")
        seed = record(example, rev, args.seconds)
        print(f"{RECORDED.relative_to(ROOT)}: {example} at seed {seed} from {rev}")
    recorded = results.read_json(RECORDED) or {}
    default = results.read_json(results.SEEDS)
    blocks = {
        results.RESULTS_PAGE: {f"example-{ex}": example_block(ex, runs, default)
                               for ex, runs in recorded.items()},
        results.README: {README_BLOCK: readme_block(recorded)},
    }  # fmt: skip
    stale = []
    for page, named in blocks.items():
        text = page.read_text()
        updated = text
        for block_name, block in named.items():
            updated = results.with_block(updated, block_name, block, page.name)
        if updated != text:
            stale.append(page.name)
            if not args.check:
                page.write_text(updated)
    if args.check and stale:
        print(f"{', '.join(stale)}: the examples differ from {RECORDED.name}: run "
              "python docs/examples.py")  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
