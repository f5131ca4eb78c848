"""What every benchmark script shares: the same command line, threads, seed and JSON output,
so their results compare across runs and machines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch


def setup(doc: str, name: str, *extra: tuple[str, dict[str, Any]]) -> argparse.Namespace:
    """Parse `--threads`, `--out` (default benchmarks/results/NAME.json) and the script's
    `extra` (flag, argparse keywords) options, pin torch's thread count and seed it."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(f"benchmarks/results/{name}.json"))
    for flag, options in extra:
        parser.add_argument(flag, **options)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    return args


def write_result(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
