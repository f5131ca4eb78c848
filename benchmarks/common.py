"""What every benchmark script shares: the same command line, threads, seed and JSON output,
so their results compare across runs and machines."""

from __future__ import annotations

import argparse
import json
import statistics
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


DEVICE_OPTION = ("--device", {"default": "cpu", "choices": ["cpu", "cuda"]})


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a host clock read after it times that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


PHASES = ("rollout", "scoring", "update")


def iteration_summary(runs: list[dict[str, float]]) -> dict[str, float]:
    """Medians over RL iterations (`RLTrainer.iteration` statistics): seconds of each phase and
    their sum, tokens sampled and trained per second, and the mean response length."""
    phases = {p: statistics.median(r[f"{p}_s"] for r in runs) for p in PHASES}
    return {
        "mean_response_tokens": round(statistics.mean(r["response_length"] for r in runs), 1),
        **{f"{p}_s": round(s, 3) for p, s in phases.items()},
        "iteration_s": round(sum(phases.values()), 3),
        "rollout_tokens_per_s": round(statistics.median(r["rollout_tokens_per_s"] for r in runs)),
        "update_tokens_per_s": round(statistics.median(r["update_tokens_per_s"] for r in runs)),
    }
