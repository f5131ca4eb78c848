"""How long `rlhf --help` takes, start to exit: the floor under every `rlhf` command.

The command imports torch and the model code only in the commands that run a model, so
help, `params`, `import`, `label` and `report` start without them. Prints a table and writes
JSON (median and worst of `--runs` runs).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from common import setup, write_result

TARGET_MEDIAN_S = 0.5


def main() -> None:
    args = setup(__doc__, "cli_startup", ("--runs", {"type": int, "default": 15}))
    command = [sys.executable, "-m", "rlhf.cli", "--help"]  # what the `rlhf` script runs
    seconds = []
    for _ in range(args.runs):
        started = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        seconds.append(time.perf_counter() - started)
    median = statistics.median(seconds)
    print(f"{'command':<16}{'runs':>6}{'median s':>10}{'worst s':>10}{'target s':>10}")
    print(
        f"{'rlhf --help':<16}{args.runs:>6}{median:>10.3f}{max(seconds):>10.3f}"
        f"{TARGET_MEDIAN_S:>10.1f}"
    )
    write_result(
        args.out,
        {
            "command": "rlhf --help",
            "runs": args.runs,
            "median_s": round(median, 4),
            "worst_s": round(max(seconds), 4),
            "target_median_s": TARGET_MEDIAN_S,
            "meets_target": median < TARGET_MEDIAN_S,
        },
    )


if __name__ == "__main__":
    main()
