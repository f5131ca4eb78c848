"""Whether the README's install-and-run reproduced the committed outputs, on any x86-64 CPU.

    python .ci/outputs.py record   # after committing outputs: this CPU made them
    python .ci/outputs.py check    # after the README's run: bytes, or the seed spread

Float rounding depends on the CPU (MKL picks kernels by vendor, AVX-512 sums in another order
than AVX2), and training compounds a last-bit difference into another run altogether. So the
committed outputs name the CPU that made them (docs/committed-cpu.json, `rlhf.cpu.
cpu_signature`), and the check that runs depends on the CPU here:

- the same signature: the bytes. The run must leave every file git tracks as it is.
- another signature: the seed spread. Every headline number `rlhf compare` shows must lie
  within the band the committed seeds (docs/seeds.json) give it (`Spread.band`); then the
  committed files are restored, so the tests read what was committed. A file the run adds that
  git does not know fails either check.

Prints which check ran and why; exit status 1 when it fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from rlhf.cpu import cpu_signature  # noqa: E402
from rlhf.eval.seeds import COMPARED, OTHER_CPU_STDS, Spread, compared_numbers  # noqa: E402
from rlhf.stages.support import paths  # noqa: E402

COMMITTED_CPU = Path("docs/committed-cpu.json")  # the CPU the committed outputs come from
SEEDS = Path("docs/seeds.json")  # `rlhf compare --json` of the default at several seeds
# numbers a run chooses among a few values rather than measures: no band around them
CHOSEN = ("eval:best_temperature.",)


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True
    ).stdout


def described(signature: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in signature.items())


def out_of_spread(numbers: dict[str, float], spread: dict[str, Spread]) -> list[str]:
    """A line for each committed headline number this run lacks or puts outside its band."""
    failures = []
    for key, s in spread.items():
        if key.startswith(CHOSEN):
            continue
        low, high = s.band()
        value = numbers.get(key)
        if value is None:
            failures.append(f"{key}: missing from this run's metrics")
        elif not low <= value <= high:
            failures.append(f"{key}: {value:.4f} outside {low:.4f} – {high:.4f}")
    return failures


def check_spread(root: Path) -> list[str]:
    """Every headline number against the committed seeds' band, printed as a table."""
    committed = json.loads((root / SEEDS).read_text())
    spread = {key: Spread(**value) for key, value in committed["spread"].items()}
    metrics = {name: json.loads((root / paths.metrics_file(name)).read_text()) for name in COMPARED}
    numbers = compared_numbers(metrics)
    seeds = len(committed["seeds"])
    print(f"{'number':<40} {'this run':>9}  band ({seeds} seeds' mean ± {OTHER_CPU_STDS:g} std)")
    for key, s in spread.items():
        low, high = s.band()
        value = numbers.get(key)
        shown = "–" if value is None else f"{value:.4f}"
        print(f"{key:<40} {shown:>9}  {low:.4f} – {high:.4f}")
    return out_of_spread(numbers, spread)


def check(root: Path) -> int:
    here, committed = cpu_signature(), json.loads((root / COMMITTED_CPU).read_text())
    status = git(root, "status", "--porcelain").splitlines()
    untracked = [line for line in status if line.startswith("??")]
    if here == committed:
        print(f"outputs check: bytes (this CPU made the committed outputs: {described(here)})")
        failures = [f"changed: {line}" for line in status]
    else:
        print(
            "outputs check: seed spread (the committed outputs come from another CPU: "
            f"{described(committed)}; this one: {described(here)})"
        )
        failures = [f"not in git: {line[3:]}" for line in untracked] + check_spread(root)
        git(root, "checkout", "--", ".")  # the tests read the committed files
    for failure in failures:
        print(f"  {failure}", file=sys.stderr)
    if failures:
        print(
            "the README's install-and-run did not reproduce the committed outputs", file=sys.stderr
        )
    return 1 if failures else 0


def record(root: Path) -> int:
    signature = cpu_signature()
    (root / COMMITTED_CPU).write_text(json.dumps(signature, indent=2) + "\n")
    print(f"{COMMITTED_CPU}: {described(signature)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("check", "record"))
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    return {"check": check, "record": record}[args.action](args.root)


if __name__ == "__main__":
    sys.exit(main())
