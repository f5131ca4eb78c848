"""The reward sources and judges a stage scores with, from params: what the collect, RL and
evaluate stages share (the other stages never import the models that score)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlhf.algorithms.scorers import ScoringContext
from rlhf.project import paths
from rlhf.project.folders import require_tracked
from rlhf.reward_sources import Source
from rlhf.stages.support.context import StageRun


def scoring_context(
    stage: StageRun, ensemble: Sequence[str | Path] = (), ensemble_reduce: str = "min"
) -> ScoringContext:
    """What the stage's scorers are built from: its tokenizer and device, the pipeline's
    reward model, and (for the RL stage, the one that reads rl.ensemble) the ensemble."""
    return ScoringContext(
        stage.tokenizer, stage.device, paths.RM_MODEL, ensemble, ensemble_reduce,
        stage.frozen_bf16,
    )  # fmt: skip


def require_sources_tracked(stage: StageRun, sources: Sequence[Source], key: str) -> None:
    """Refuse, before the stage loads anything, a file or folder that a source under params
    `key` reads from outside the pipeline, where dvc.yaml does not list it among the stage's
    deps (`require_tracked`)."""
    for source in sources:
        if source.path is not None:
            require_tracked(stage.spec.name, source.path, key)
