"""Where every stage reads and writes, relative to the DVC repository root.

The same paths appear in dvc.yaml; keeping them in one module keeps the two in step.
"""

from pathlib import Path

PARAMS = Path("params.yaml")

RAW_SFT = Path("data/raw/sft.parquet")
PREPARED = Path("data/prepared")
SFT_TRAIN = PREPARED / "sft_train.parquet"
SFT_VAL = PREPARED / "sft_val.parquet"
PROMPTS_TRAIN = PREPARED / "prompts_train.parquet"
PROMPTS_HELDOUT = PREPARED / "prompts_heldout.parquet"

RAW_COMPARISONS = Path("data/raw/comparisons.parquet")
COLLECTED = Path("data/collected")
COMPARISONS_TRAIN = COLLECTED / "comparisons_train.parquet"
COMPARISONS_VAL = COLLECTED / "comparisons_val.parquet"

TOKENIZER = Path("artifacts/tokenizer")
SFT_MODEL = Path("artifacts/sft/model.pt")
RM_MODEL = Path("artifacts/rm/model.pt")
PPO_MODEL = Path("artifacts/ppo/model.pt")
PPO_SAMPLES = Path("artifacts/ppo/samples.jsonl")
PPO_SNAPSHOTS = Path("artifacts/ppo/snapshots")  # policy every ppo.snapshot_every iterations
DPO_MODEL = Path("artifacts/dpo/model.pt")

# Every policy the evaluation compares, by the name its metric keys use; absent ones are skipped.
POLICIES = {"sft": SFT_MODEL, "ppo": PPO_MODEL, "dpo": DPO_MODEL}

METRICS = Path("metrics")
SFT_METRICS = METRICS / "sft.json"
SFT_STEPS = METRICS / "sft_steps.csv"
SFT_EPOCHS = METRICS / "sft_epochs.csv"
COLLECT_METRICS = METRICS / "collect.json"
RM_METRICS = METRICS / "rm.json"
RM_STEPS = METRICS / "rm_steps.csv"
RM_EPOCHS = METRICS / "rm_epochs.csv"
PPO_METRICS = METRICS / "ppo.json"
PPO_STEPS = METRICS / "ppo_steps.csv"
DPO_METRICS = METRICS / "dpo.json"
DPO_STEPS = METRICS / "dpo_steps.csv"
DPO_EPOCHS = METRICS / "dpo_epochs.csv"
EVAL_METRICS = METRICS / "eval.json"
EVAL_CURVE = METRICS / "eval_overoptimization.csv"

REPORTS = Path("reports")
REPORT = REPORTS / "eval.md"

# Resume state lives outside every stage's outs: DVC deletes outs before rerunning a stage.
RESUME = Path(".rlhf/resume")
