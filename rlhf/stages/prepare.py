"""prepare: write the train/validation demonstrations and the train/held-out prompt sets, from
the synthetic task suite or from the user's imported demonstrations (`data.source`)."""

from __future__ import annotations

from collections import Counter

from rlhf.data.schemas import PROMPT_SCHEMA, SFT_SCHEMA, DataError, read_rows, write_rows
from rlhf.data.splits import MIN_HELDOUT, split_demonstrations
from rlhf.project import paths
from rlhf.project.specs import StageSpec
from rlhf.stages.support.common import console, params
from rlhf.stages.support.entry import main
from rlhf.stages.support.outputs import begin, published
from rlhf.synthetic.datasets import synthetic_sets

SPEC = StageSpec(
    "prepare",
    "rlhf.stages.prepare",
    params=("seed", "data"),
    inputs=(paths.RAW,),
    outs=(paths.SFT_TRAIN, paths.SFT_VAL, paths.PROMPTS_TRAIN, paths.PROMPTS_HELDOUT),
)


def run() -> dict[str, int]:
    begin(SPEC)
    p = params()
    if p.data.source == "synthetic":
        sets = synthetic_sets(p.data, p.seed)
    else:
        if not paths.RAW_SFT.exists():
            raise DataError(
                f"data.source is 'files' but {paths.RAW_SFT} does not exist; create it with "
                f"`rlhf import YOUR_FILE.jsonl` and track it with `dvc add {paths.RAW_SFT}`"
            )
        rows = read_rows(paths.RAW_SFT, SFT_SCHEMA)
        sets = split_demonstrations(
            rows, p.data.val_fraction, p.data.heldout_fraction, p.seed, str(paths.RAW_SFT)
        )
    with published(SPEC) as out:
        write_rows(out[paths.SFT_TRAIN], sets["train"], SFT_SCHEMA)
        write_rows(out[paths.SFT_VAL], sets["val"], SFT_SCHEMA)
        write_rows(out[paths.PROMPTS_TRAIN], sets["prompts_train"], PROMPT_SCHEMA)
        write_rows(out[paths.PROMPTS_HELDOUT], sets["prompts_heldout"], PROMPT_SCHEMA)
    counts = {name: len(rows) for name, rows in sets.items()}
    per_task = Counter(r["task"] for r in sets["prompts_heldout"])
    console.print(f"prepare ({p.data.source}): {counts}; held-out per task: {dict(per_task)}")
    if counts["prompts_heldout"] < MIN_HELDOUT:
        console.print(
            f"warning: only {counts['prompts_heldout']} held-out prompts (fewer than "
            f"{MIN_HELDOUT}): every win rate's interval will be wide; "
            + ("raise data.n_heldout" if p.data.source == "synthetic" else "import more prompts")
        )
    return counts


if __name__ == "__main__":
    main(run)
