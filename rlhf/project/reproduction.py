"""Whether a run reproduced the committed outputs, on any x86-64 CPU: `rlhf reproduced`, and
CI's check of the README's install-and-run (`.ci/outputs.py`).

Float rounding depends on the CPU (MKL picks kernels by vendor, AVX-512 sums in another order
than AVX2) unless `cpu_kernels` pins them, and training compounds a last-bit difference into
another run altogether. So the committed outputs name the CPU that made them (`COMMITTED_CPU`,
`rlhf.cpu.cpu_signature`), and the check that runs depends on the CPU here:

- the same signature: the bytes. The run must leave every file git tracks as it is.
- another signature: the seed spread. Every headline number `rlhf compare` shows must lie
  within the band the committed seeds (`SEEDS`) give it (`Spread.band`). Whether the run
  reproduced the bytes there too is reported (`Verdict.bytes`), not required: that is how
  the pinned kernels' bytes are verified on other CPU families.

A file the run adds that git does not know fails either check.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from rlhf.cpu import cpu_signature
from rlhf.errors import OutputError
from rlhf.eval.seeds import OTHER_CPU_STDS
from rlhf.params import load_params
from rlhf.project import paths
from rlhf.project.drift import check as check_drift

COMMITTED_CPU = Path("docs/committed-cpu.json")  # the CPU the committed outputs come from
SEEDS = Path("docs/seeds.json")  # `rlhf compare --json` of the default at several seeds
BYTES, SEED_SPREAD = "bytes", "seed spread"


@dataclass
class Verdict:
    check: str  # BYTES or SEED_SPREAD
    why: str  # which CPUs: the reason that check ran
    table: list[str] = field(default_factory=list)  # the spread check's numbers, a line each
    failures: list[str] = field(default_factory=list)  # empty: reproduced
    bytes: str = ""  # on another CPU: whether the run reproduced the bytes all the same


def described(signature: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in signature.items())


def committed_cpu(root: Path) -> dict[str, str] | None:
    """The signature of the CPU that made the committed outputs; None where none is recorded
    (a project of the user's own)."""
    path = root / COMMITTED_CPU
    return json.loads(path.read_text()) if path.is_file() else None


def signature_here(root: Path) -> dict[str, str]:
    """This CPU's signature under the kernels the project's stages pin (its params.yaml)."""
    return cpu_signature(load_params(root / paths.PARAMS).cpu_kernels)


def other_cpu_line(root: Path) -> str | None:
    """One line for a user whose numbers may differ from the committed ones because this CPU
    is not the one that made them; None on that CPU, or where no CPU is recorded."""
    committed = committed_cpu(root)
    here = signature_here(root)
    if committed is None or committed == here:
        return None
    return (
        f"the committed outputs were made on another CPU ({committed['model']}, "
        f"{committed.get('kernels', 'native')} kernels, torch {committed['torch']}; this one: "
        f"{here['model']}, {here['kernels']} kernels, torch {here['torch']}): where float "
        "rounding differs, this run's numbers differ as another seed's would; `rlhf reproduced` "
        "checks that they lie within the committed seed spread"
    )


def spread_table(root: Path) -> tuple[list[str], list[str]]:
    """Every headline number of the run in `root` against the committed seeds' band: the
    table's lines, and the numbers outside."""
    drift = check_drift(root, SEEDS, OTHER_CPU_STDS)
    seeds = max(reading.spread.seeds for reading in drift.readings)
    lines = [f"{'number':<40} {'this run':>9}  band ({seeds} seeds' mean ± {OTHER_CPU_STDS:g} std)"]
    for reading in drift.readings:
        low, high = reading.spread.band(OTHER_CPU_STDS)
        shown = "–" if reading.value is None else f"{reading.value:.4f}"
        lines.append(f"{reading.key:<40} {shown:>9}  {low:.4f} – {high:.4f}")
    return lines, drift.failures


def check(root: Path) -> Verdict:
    """The bytes on the CPU that made the committed outputs, the seed spread on any other."""
    committed, here = committed_cpu(root), signature_here(root)
    if committed is None:
        raise OutputError(f"{root / COMMITTED_CPU}: no record of the CPU that made the outputs")
    status = git_status(root)
    if here == committed:
        why = f"this CPU made the committed outputs: {described(here)}"
        return Verdict(BYTES, why, failures=[f"changed: {line}" for line in status])
    why = (
        f"the committed outputs come from another CPU: {described(committed)}; "
        f"this one: {described(here)}"
    )
    table, failures = spread_table(root)
    untracked = [f"not in git: {line[3:]}" for line in status if line.startswith("??")]
    return Verdict(SEED_SPREAD, why, table, untracked + failures, bytes_report(status))


def bytes_report(status: list[str]) -> str:
    """Whether a run on another CPU left every committed file as it is, in a line."""
    changed = [line[3:] for line in status if not line.startswith("??")]
    if not changed:
        return "bytes: identical: this CPU reproduced every committed file byte for byte"
    shown = ", ".join(changed[:3]) + (", ..." if len(changed) > 3 else "")
    return f"bytes: {len(changed)} committed files differ on this CPU ({shown})"


def git_status(root: Path) -> list[str]:
    done = subprocess.run(
        ["git", "status", "--porcelain"], cwd=root, check=True, capture_output=True, text=True
    )
    return done.stdout.splitlines()
