"""Whether the README's install-and-run reproduced the committed outputs, on any x86-64 CPU.

    python .ci/outputs.py record   # after committing outputs: this CPU made them
    python .ci/outputs.py check    # after the README's run: bytes, or the seed spread

The check is `rlhf reproduced`'s (`rlhf.project.reproduction`): on the CPU that made the
committed outputs (docs/committed-cpu.json) the run must leave every file git tracks as it is;
on any other, every headline number must lie within the committed seeds' band (and whether
the bytes matched all the same is reported), and then the committed files are restored, so
the tests read what was committed.

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

from rlhf.project import reproduction  # noqa: E402


def check(root: Path) -> int:
    verdict = reproduction.check(root)
    print(f"outputs check: {verdict.check} ({verdict.why})")
    for line in verdict.table:
        print(line)
    if verdict.bytes:
        print(verdict.bytes)
    if verdict.check == reproduction.SEED_SPREAD:  # the tests read the committed files
        subprocess.run(["git", "checkout", "--", "."], cwd=root, check=True)
    for failure in verdict.failures:
        print(f"  {failure}", file=sys.stderr)
    if verdict.failures:
        print(
            "the README's install-and-run did not reproduce the committed outputs", file=sys.stderr
        )
    return 1 if verdict.failures else 0


def record(root: Path) -> int:
    signature = reproduction.signature_here(root)
    path = root / reproduction.COMMITTED_CPU
    path.write_text(json.dumps(signature, indent=2) + "\n")
    print(f"{reproduction.COMMITTED_CPU}: {reproduction.described(signature)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("check", "record"))
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    return {"check": check, "record": record}[args.action](args.root)


if __name__ == "__main__":
    sys.exit(main())
