"""What a stage trained by the shared loop adds to the skeleton: the loop with this stage's
seed, device, resume file and fingerprint, a progress bar and a curve log, and publishing its
outputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlhf.models import checkpoint
from rlhf.models.backbone import Backbone
from rlhf.params.groups import OptimParams
from rlhf.project import paths
from rlhf.stages.support.context import StageRun
from rlhf.stages.support.outputs import published, write_metrics, write_timings
from rlhf.stages.support.trained import finish, reporting, stage_curves
from rlhf.train import loop


def fit(
    stage: StageRun,
    model: Backbone,
    opt: OptimParams,
    objective: loop.Objective,
    *,
    n_examples: int,
    lengths: Sequence[int] | None = None,
    status: Callable[[float], str] = lambda loss: f"loss {loss:.3f}",
    dropout: bool = True,
) -> tuple[loop.History, Backbone]:
    """`rlhf.train.loop.fit` for this stage, with a progress bar showing `status(loss)` and
    each step's point logged to the stage's training curves, under the stage's
    `train.strategy`; returns the history and the trained model, whole."""
    with reporting(stage) as (bar, curves):
        task = bar.add_task(stage.spec.address, total=None, extra="")
        callbacks = loop.Callbacks(
            on_step=lambda step, total, loss: bar.update(
                task, completed=step, total=total, extra=status(loss)
            ),
            on_point=curves.log,
            log=stage.log,
        )
        return loop.fit(
            model,
            opt,
            objective,
            seed=stage.params.seed,
            n_examples=n_examples,
            device=stage.device,
            resume=loop.ResumeFile(stage.spec.resume_file, stage.fingerprint()),
            lengths=lengths,
            callbacks=callbacks,
            dropout=dropout,
            world=stage.world,
            strategy=stage.params.train.strategy,
        )


def publish(
    stage: StageRun, payload: dict[str, Any], history: loop.History, metrics: dict[str, Any]
) -> None:
    """Write a trained stage's outputs, all together, and only then drop its resume state
    and live curves: a crash in between resumes and rewrites rather than retraining from
    scratch. Its speed goes to its timings file, outside the outputs. Rank 0 alone writes."""
    if not stage.world.is_main:
        return
    name = stage.spec.name
    with published(stage.spec) as out:
        checkpoint.save(out[paths.model_file(name)], payload)
        stage_curves(out, stage.spec)
        write_metrics(out, stage.spec, metrics)
    write_timings(name, {"tokens_per_s": history.tokens_per_s})
    finish(stage.spec)
