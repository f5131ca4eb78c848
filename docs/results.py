"""The results tables of README.md and docs/results.md, written from the committed metrics so
they cannot go stale.

    python docs/results.py           # rewrite the block between the results markers
    python docs/results.py --check   # exit 1, naming the file, when the block is stale

The block between `<!-- results:begin -->` and `<!-- results:end -->` is generated from
docs/seeds.json (the spread of the headline numbers over seeds, `rlhf compare --json`) and
metrics/eval.json and metrics/rm.json with their details in metrics/details/ (what
`dvc repro` committed): every policy's gold score, reward and KL to the SFT policy, and each
pair's gold win rate with its interval, through the same tables reports/eval.md shows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from rlhf.eval.report import policies_table, win_rates_table  # noqa: E402
from rlhf.eval.seeds import compared_numbers  # noqa: E402
from rlhf.stages.support.metric_files import read_metrics  # noqa: E402

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
TARGETS = (ROOT / "README.md", ROOT / "docs" / "results.md")
JUDGE = "gold"
SEEDS = ROOT / "docs" / "seeds.json"  # `rlhf compare --json` of the default at several seeds


def results_markdown(evaluation: dict[str, Any], reward_model: dict[str, Any], seed: int) -> str:
    """The results block: what the default `dvc repro` measured, one run at its seed."""
    accuracy = reward_model["acc_gold"]
    lines = [
        f"The default pipeline (`dvc repro`, seed {seed}) on {evaluation['prompts']} held-out "
        "prompts; the reward model orders "
        f"{accuracy:.1%} of held-out comparisons as the gold judge does. Generated from "
        "`metrics/` by `python docs/results.py`.",
        "",
        *policies_table(evaluation),
        f"Win rates judged by {JUDGE}, ties half, 95% bootstrap over prompts:",
        "",
        *win_rates_table(evaluation, JUDGE),
    ]
    return "\n".join(lines).rstrip("\n")


def seeds_markdown(compared: dict[str, Any]) -> list[str]:
    """The spread over seeds of the numbers a reader compares (`rlhf compare --json` of the
    default run at several seeds): gold win rate over SFT, gold score, KL to SFT, RM accuracy."""
    seeds = ", ".join(sorted(compared["seeds"], key=int))
    rows = []
    for key, spread in compared["spread"].items():
        name = key.split(":", 1)[1]
        shown = (
            (name.startswith("win_rate.gold.") and name.endswith("_vs_sft"))
            or name.startswith("gold_sampled.")
            or (name.startswith("kl_to_sft.") and not name.endswith(".sft"))
            or name == "acc_gold"
        )
        if shown:
            rows.append(
                f"| `{key}` | {spread['mean']:.3f} ± {spread['std']:.3f} | "
                f"{spread['low']:.3f} – {spread['high']:.3f} |"
            )
    return [
        f"Over {len(compared['seeds'])} seeds of the default ({seeds}; `rlhf seeds`, then "
        "`rlhf compare --json > docs/seeds.json`): mean ± standard deviation, and the range. A "
        "difference smaller than about two standard deviations is seed noise.",
        "",
        "| number | mean ± std | min – max |",
        "| --- | --- | --- |",
        *rows,
        "",
    ]


def with_results(text: str, block: str, name: str) -> str:
    """`text` with the block between the markers replaced by `block`."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"{name}: needs one {BEGIN} and one {END} line")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report a stale block")
    check = parser.parse_args(argv).check
    for name in ("eval", "rm"):  # DVC-cached: a checkout without them cannot say anything
        if not (ROOT / "metrics" / "details" / f"{name}.json").exists():
            print(f"metrics/details/{name}.json is missing: run `dvc pull` (or `dvc repro`)")
            return 1
    metrics = {name: read_metrics(name, ROOT) for name in ("eval", "rm")}
    seed = yaml.safe_load((ROOT / "params.yaml").read_text())["seed"]
    block = results_markdown(metrics["eval"], metrics["rm"], seed)
    if SEEDS.exists():
        compared = json.loads(SEEDS.read_text())
        if compared["seeds"].get(str(seed)) != compared_numbers(metrics):
            print(f"{SEEDS.name}: its run at seed {seed} is not the one in metrics/: rerun "
                  "`rlhf seeds` and `rlhf compare --json > docs/seeds.json`")  # fmt: skip
            return 1
        block = "\n".join([*seeds_markdown(compared), block])
    stale = []
    for target in TARGETS:
        text = target.read_text()
        updated = with_results(text, block, target.name)
        if updated != text:
            stale.append(target.name)
            if not check:
                target.write_text(updated)
    if check and stale:
        print(f"{', '.join(stale)}: the results differ from metrics/: run python docs/results.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
