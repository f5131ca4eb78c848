"""The reward sources and judges a stage scores with, built from params: what the collect, RL
and evaluate stages share (the other stages never import the models that score)."""

from __future__ import annotations

from rlhf.algorithms.scorers import PairJudge, Scorer, ScoringContext, build
from rlhf.reward_sources import Source
from rlhf.stages.support import paths
from rlhf.stages.support.context import StageRun
from rlhf.stages.support.folders import require_tracked


def scoring_context(stage: StageRun) -> ScoringContext:
    p = stage.params
    return ScoringContext(
        stage.tokenizer, stage.device, paths.RM_MODEL, p.rl.ensemble, p.rl.ensemble_reduce,
        stage.frozen_bf16,
    )  # fmt: skip


def build_tracked(
    stage: StageRun, source: Source, key: str, context: ScoringContext
) -> Scorer | PairJudge:
    """`source`'s scorer; a file or folder it reads outside the pipeline must be among the
    stage's deps in dvc.yaml (`require_tracked`)."""
    if source.path is not None:
        require_tracked(stage.spec.name, source.path, key)
    return build(source, context)
