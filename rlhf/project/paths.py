"""Where every stage reads and writes, relative to the DVC repository root.

A trained stage NAME writes `artifacts/NAME/model.pt`, `metrics/NAME.json` (its headline
numbers), `metrics/details/NAME.json` (the rest) and its training curves, one dvclive TSV per
metric in `dvclive/NAME/plots/metrics/`; an RL stage is named after its algorithm. Each stage's
SPEC says which of these it reads and writes.
"""

from pathlib import Path

PARAMS = Path("params.yaml")

RAW = Path("data/raw")
RAW_SFT = RAW / "sft.parquet"
RAW_COMPARISONS = RAW / "comparisons.parquet"
PREPARED = Path("data/prepared")
SFT_TRAIN = PREPARED / "sft_train.parquet"
SFT_VAL = PREPARED / "sft_val.parquet"
PROMPTS_TRAIN = PREPARED / "prompts_train.parquet"
PROMPTS_HELDOUT = PREPARED / "prompts_heldout.parquet"
COLLECTED = Path("data/collected")
COMPARISONS_TRAIN = COLLECTED / "comparisons_train.parquet"
COMPARISONS_VAL = COLLECTED / "comparisons_val.parquet"

ARTIFACTS = Path("artifacts")
TOKENIZER = ARTIFACTS / "tokenizer"
METRICS = Path("metrics")
DETAILS = METRICS / "details"  # what each stage measured, beyond its headline
REPORTS = Path("reports")
REPORT = REPORTS / "eval.md"

# Throughput and wall time: neither DVC outputs nor in git, since no rerun reproduces them
# (outputs.write_timings).
TIMINGS = Path("timings")

# Resume state lives outside every stage's outs: DVC deletes outs before rerunning a stage.
RESUME = Path(".rlhf/resume")
# Where a stage's curve log writes while it trains; published with its other outputs at the
# end, so a failed or killed run leaves the last published curves as they were.
LIVE = Path(".rlhf/live")


def model_file(stage: str) -> Path:
    return ARTIFACTS / stage / "model.pt"


def metrics_file(stage: str) -> Path:
    """The stage's headline numbers, what DVC's metrics views read."""
    return METRICS / f"{stage}.json"


def details_file(stage: str) -> Path:
    """Everything else the stage measured (`metric_files.py`), an output DVC's metrics views
    do not read."""
    return DETAILS / f"{stage}.json"


def timings_file(stage: str) -> Path:
    return TIMINGS / f"{stage}.json"


def timing_steps_file(stage: str) -> Path:
    return TIMINGS / f"{stage}_steps.csv"


def curves_folder(stage: str) -> Path:
    """The stage's published training curves: `train_loss.tsv`, `epoch/val_loss.tsv`, ..."""
    return Path("dvclive") / stage / "plots" / "metrics"  # rlhf.train.curves.METRICS_FOLDER


def samples_file(algorithm: str) -> Path:
    """Sample answers an RL stage logged along training."""
    return ARTIFACTS / algorithm / "samples.jsonl"


def snapshots_dir(algorithm: str) -> Path:
    """An RL policy every `rl.snapshot_every` iterations, for the over-optimization curve."""
    return ARTIFACTS / algorithm / "snapshots"


SFT_MODEL = model_file("sft")
RM_MODEL = model_file("rm")
EVAL_METRICS = METRICS / "eval"  # metrics/eval/<policy>.json, one per policy
EVAL_CURVE = METRICS / "eval_overoptimization.csv"

# collect.labeler: human. The queue is rewritten only when the sampled answers change; the
# labels folder (one file per labeler, written by `rlhf label`) is a DVC dep of collect.
LABELING = Path("labeling")
LABEL_QUEUE = LABELING / "queue.parquet"
LABELS = LABELING / "labels"
