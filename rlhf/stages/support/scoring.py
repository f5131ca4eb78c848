"""The reward sources and judges a stage scores with, from params: what the collect, RL and
evaluate stages share (the other stages never import the models that score)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhf.algorithms.scorers import ScoringContext
from rlhf.data.rows import DataError
from rlhf.params.groups import RLParams
from rlhf.project import paths
from rlhf.project.folders import require_tracked
from rlhf.reward_sources import Source
from rlhf.stages.support.context import StageRun


def scoring_context(
    stage: StageRun,
    references: Mapping[str, str | None] | None = None,
    rl: RLParams | None = None,
) -> ScoringContext:
    """What the stage's scorers are built from: its tokenizer and device, the pipeline's
    reward model, the prompts' reference answers that `check:EXTRACTOR` compares with
    (`prompt_references`) and, for the RL stage (`rl`, its params group), the ensemble and
    the checker's format reward."""
    ensemble = (
        {}
        if rl is None
        else {
            "ensemble": stage.params.ensemble(),
            "ensemble_reduce": rl.ensemble_reduce,
            "ensemble_weights": rl.ensemble_weights,
            "format_reward": rl.format_reward,
        }
    )
    return ScoringContext(
        stage.tokenizer, stage.device, paths.RM_MODEL, frozen_bf16=stage.frozen_bf16,
        references=references or {}, **ensemble,
    )  # fmt: skip


def prompt_references(
    files: Mapping[Path, Sequence[dict[str, Any]]], checks: Sequence[tuple[str, str]]
) -> dict[str, str | None]:
    """Each prompt's reference answer in these files of prompt rows. Where a setting among
    `checks` ((key, value) pairs, `Params.checked`) compares answers with references, a prompt
    without one is refused before anything loads, naming the file, the row and the key."""
    found: dict[str, str | None] = {}
    for path, rows in files.items():
        for number, row in enumerate(rows, start=1):
            if checks and row.get("reference") is None:
                key, value = checks[0]
                raise DataError(
                    f"{path}: row {number}: field 'reference': is null, but {key} names "
                    f"{value!r}, which checks every answer against its prompt's reference: "
                    "import questions with their answers (`rlhf import --kind gsm8k` or `qa`)"
                )
            found[row["prompt"]] = row.get("reference")
    return found


def require_sources_tracked(stage: StageRun, sources: Sequence[Source], key: str) -> None:
    """Refuse, before the stage loads anything, a file or folder that a source under params
    `key` reads from outside the pipeline, where dvc.yaml does not list it among the stage's
    deps (`require_tracked`)."""
    for source in sources:
        if source.path is not None:
            require_tracked(stage.spec.name, source.path, key)
