"""Every stage in pipeline order, as the command line, the flows and dvc.yaml address it: its
name, what it does, and how it runs.

Light on purpose (no stage module is imported): `rlhf --help` and the flows' stage enum read it
without importing torch. Each stage module declares the rest itself (its SPEC: params groups,
inputs, outputs); a test checks this list against the modules.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhf.params.groups import RL_ALGORITHMS


@dataclass(frozen=True)
class StageEntry:
    name: str  # the module `rlhf.stages.NAME`, the command `rlhf NAME`, dvc.yaml's stage
    summary: str  # what it does: the command's help
    data_parallel: bool = False  # runs as RLHF_NPROC processes (`support/launch.py`)
    resumes: bool = False  # an interrupted run resumes where it stopped
    items: tuple[str, ...] = ()  # a foreach stage's elements (`rl@ppo`), given as an argument
    item_name: str = ""  # that argument's name
    item_help: str = ""  # and its help

    @property
    def module(self) -> str:
        return f"rlhf.stages.{self.name}"

    def help(self) -> str:
        """The command's help: the summary, then the stage it runs and how."""
        stage = f"{self.name}@{self.item_name.upper()}" if self.items else self.name
        how = ["resumes if interrupted"] * self.resumes + ["RLHF_NPROC processes"] * (
            self.data_parallel
        )
        return f"{self.summary} (stage `{stage}`)" + "".join(f"; {h}" for h in how) + "."


STAGES = (
    StageEntry("prepare", "Write the train/validation/held-out Parquet sets"),
    StageEntry("tokenizer", "Train or build the tokenizer"),
    StageEntry(
        "sft", "Supervised fine-tuning on the demonstrations", data_parallel=True, resumes=True
    ),
    StageEntry("collect", "Sample K answers per prompt from the SFT policy and rank them"),
    StageEntry("rm", "Train the reward model on the ranked comparisons", data_parallel=True),
    StageEntry(
        "rl", "Optimize the SFT policy with an RL algorithm", data_parallel=True, resumes=True,
        items=RL_ALGORITHMS, item_name="algorithm",
        item_help=f"One of {', '.join(RL_ALGORITHMS)}; its params group in params.yaml says "
        "how it optimizes.",
    ),
    StageEntry(
        "dpo", "Direct preference optimization of the SFT policy on the comparisons",
        data_parallel=True, resumes=True,
    ),
    StageEntry(
        "evaluate",
        "Every policy on the held-out prompts: win rates, over-optimization, the report",
    ),
)  # fmt: skip
STAGE_MODULES = tuple(stage.module for stage in STAGES)
