"""The verifiable-rewards result of docs/results.md, written from recorded runs of
examples/verifiable.params.yaml so its table and sentence cannot go stale.

    python docs/verifiable.py --record SEED RUN_ROOT [--seconds S]  # a finished `dvc repro`
    python docs/verifiable.py --record-variant NAME SEED RUN_ROOT --settings 'grpo.k=v ...'
    python docs/verifiable.py                         # rewrite the generated blocks
    python docs/verifiable.py --check                 # exit 1 when a block is stale

The second block (`verifiable-variants`) sets GRPO's variants side by side (the example's own
settings, Dr. GRPO, DAPO, GSPO: the example run again with each one's `-S` settings, recorded by
`--record-variant` in docs/verifiable-variants.json).

The block sits between `<!-- verifiable:begin -->` and `<!-- verifiable:end -->`: each
policy's held-out accuracy by the answer checker (mean ± std over the recorded seeds, and each
seed's with its 95% bootstrap interval), greedy accuracy and pass@k, then whether GRPO, rewarded
by the checker, beats SFT at every seed. The recorded numbers (docs/verifiable-seeds.json) are
the runs' metrics/details/eval.json, cut to the checker's numbers.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "docs" / "verifiable-seeds.json"
VARIANTS = ROOT / "docs" / "verifiable-variants.json"
PAGE = ROOT / "docs" / "results.md"
BLOCK, VARIANTS_BLOCK = "verifiable", "verifiable-variants"
JUDGE = "check:last_number"  # the example's checker
KEYS = ("accuracy", "accuracy_ci95", "accuracy_greedy", "pass_at_k")
LEARNER, BASELINE = "grpo", "sft"


def record(seed: str, run_root: Path, seconds: float | None) -> None:
    """Add (or replace) one seed's checker numbers, from a run's details, to RECORDED, with
    how long its whole `dvc repro` took where it ran alone (`seconds`)."""
    details = json.loads((run_root / "metrics" / "details" / "eval.json").read_text())
    runs = json.loads(RECORDED.read_text()) if RECORDED.exists() else {}
    runs[seed] = {key: details[key][JUDGE] for key in KEYS}
    if seconds is not None:
        runs[seed]["seconds"] = round(seconds)
    RECORDED.write_text(json.dumps(dict(sorted(runs.items())), indent=2) + "\n")


def record_variant(name: str, seed: str, run_root: Path, settings: list[str]) -> None:
    """Add (or replace) one seed of a GRPO variant: its settings and GRPO's checker numbers."""
    details = json.loads((run_root / "metrics" / "details" / "eval.json").read_text())
    variants = json.loads(VARIANTS.read_text()) if VARIANTS.exists() else {}
    entry = variants.setdefault(name, {"settings": settings, "seeds": {}})
    entry["settings"] = settings
    entry["seeds"][seed] = {key: details[key][JUDGE][LEARNER] for key in KEYS} | {
        "kl": details["kl_to_sft"][LEARNER]
    }
    VARIANTS.write_text(json.dumps(variants, indent=2) + "\n")


def variants_block(variants: Mapping[str, Any], runs: Mapping[str, Any]) -> str:
    """GRPO in each recorded variant (the example's own among them) at the seeds each ran,
    then each variant against the example's GRPO (`runs`, RECORDED) seed by seed."""
    seeds = sorted({seed for v in variants.values() for seed in v["seeds"]})
    header = ["GRPO", "settings", "accuracy, sampled"]
    header += [f"seed {s}: accuracy (95% interval)" for s in seeds]
    header += ["accuracy, greedy", "pass@2", "KL to SFT"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for name, variant in variants.items():
        measured = variant["seeds"]
        cells = [name, ", ".join(f"`{s}`" for s in variant["settings"]) or "the file's"]
        cells.append(spread([run["accuracy"] for run in measured.values()]))
        for seed in seeds:
            if seed not in measured:
                cells.append("–")
                continue
            run, ci = measured[seed], measured[seed]["accuracy_ci95"]
            cells.append(f"{run['accuracy']:.3f} ({ci['low']:.3f} – {ci['high']:.3f})")
        each = measured.values()
        cells.append(spread([run["accuracy_greedy"] for run in each]))
        cells.append(spread([run["pass_at_k"]["2"] for run in each]))
        cells.append(spread([run["kl"] for run in each]))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for name, variant in variants.items():
        shared = sorted(seed for seed in variant["seeds"] if seed in runs)
        if not variant["settings"] or not shared:
            continue
        gains = [variant["seeds"][s]["accuracy"] - runs[s]["accuracy"][LEARNER] for s in shared]
        verdict = (
            "above it at every one" if all(g > 0 for g in gains) else "not above it at every one"
        )
        lines.append(
            f"- {name} against the example's GRPO at the same seed: "
            + ", ".join(f"{g:+.3f} (seed {s})" for g, s in zip(gains, shared, strict=True))
            + f"; {verdict}."
        )
    return "\n".join(lines).rstrip()


def seed_values(
    runs: Mapping[str, Mapping[str, Any]], policy: str, key: str, *path: str
) -> list[float]:
    """`policy`'s number under `key` (and `path` within it) at each recorded seed."""
    found = []
    for run in runs.values():
        value: Any = run[key][policy]
        for part in path:
            value = value[part]
        found.append(value)
    return found


def spread(values: list[float]) -> str:
    """mean ± std over seeds (the std where there are two or more)."""
    mean = statistics.fmean(values)
    return f"{mean:.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{mean:.3f}"


def block(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """The generated Markdown: the table, then the sentence on GRPO against SFT."""
    seeds = list(runs)
    measured = runs[seeds[0]]["accuracy"]
    policies = [BASELINE, LEARNER, *sorted(set(measured) - {BASELINE, LEARNER})]
    ks = list(runs[seeds[0]]["pass_at_k"][BASELINE])
    header = ["policy", "accuracy, sampled", *(f"seed {s} (95% interval)" for s in seeds)]
    header += ["accuracy, greedy", *(f"pass@{k}" for k in ks)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for policy in policies:
        values = functools.partial(seed_values, runs, policy)
        cells = [policy, spread(values("accuracy"))]
        for run in runs.values():
            ci = run["accuracy_ci95"][policy]
            cells.append(f"{run['accuracy'][policy]:.3f} ({ci['low']:.3f} – {ci['high']:.3f})")
        cells.append(spread(values("accuracy_greedy")))
        cells += [spread(values("pass_at_k", k)) for k in ks]
        lines.append("| " + " | ".join(cells) + " |")
    gains = {s: run["accuracy"][LEARNER] - run["accuracy"][BASELINE] for s, run in runs.items()}
    beats = all(gain > 0 for gain in gains.values())
    lines += [
        "",
        f"GRPO rewarded by the checker {'raises' if beats else 'does not raise'} held-out "
        "accuracy above SFT's at every seed: by "
        + ", ".join(f"{gains[s]:+.3f} (seed {s})" for s in seeds)
        + f", {spread(list(gains.values()))} over the {len(seeds)} seeds.",
    ]
    timed = {s: run["seconds"] for s, run in runs.items() if "seconds" in run}
    if timed:
        lines += [
            "",
            "Its whole `dvc repro` on this 2-core machine: "
            + ", ".join(f"{t // 60} min {t % 60} s (seed {s})" for s, t in timed.items())
            + "; the other seeds' runs shared the CPU and are not timed.",
        ]
    return "\n".join(lines)


def with_block(text: str, generated: str, name: str = BLOCK) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"{PAGE.name}: needs one {begin} and one {end} line")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{generated}\n{end}{rest.split(end)[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report a stale block")
    parser.add_argument("--record", nargs=2, metavar=("SEED", "RUN_ROOT"))
    parser.add_argument("--seconds", type=float, help="the recorded run's whole time, run alone")
    parser.add_argument("--record-variant", nargs=3, metavar=("NAME", "SEED", "RUN_ROOT"))
    parser.add_argument("--settings", nargs="*", default=[], help="the variant's -S settings")
    args = parser.parse_args(argv)
    if args.record:
        record(args.record[0], Path(args.record[1]), args.seconds)
    if args.record_variant:
        name, seed, root = args.record_variant
        record_variant(name, seed, Path(root), args.settings)
    text = PAGE.read_text()
    runs = json.loads(RECORDED.read_text())
    updated = with_block(text, block(runs))
    if VARIANTS.exists():
        generated = variants_block(json.loads(VARIANTS.read_text()), runs)
        updated = with_block(updated, generated, VARIANTS_BLOCK)
    if updated != text:
        if args.check:
            print(f"{PAGE.name}: a verifiable block differs from {RECORDED.name} or "
                  f"{VARIANTS.name}: run python docs/verifiable.py")  # fmt: skip
            return 1
        PAGE.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
