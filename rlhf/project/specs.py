"""How a stage is declared: its command, params groups, inputs and outputs, said once.

Each stage module declares its `SPEC`; dvc.yaml is generated from those declarations
(`dvcfile.py`), with each stage's code dependencies computed from its imports (`imports.py`),
and a stage's resume fingerprint covers the same params, inputs and code, so a resume never
mixes runs that DVC would tell apart. The RL stage is one declaration run once per name in
`rl_algorithms` (DVC's foreach): its paths and params hold `${item}`, which DVC fills in, and
`StageSpec.filled(name)` here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlhf.project import paths

ITEM = "${item}"  # DVC's placeholder for the element of a foreach stage


@dataclass(frozen=True)
class StageSpec:
    name: str  # the stage name in dvc.yaml (`rl` is the foreach group `rl@ppo`, ...)
    module: str  # run as `python -m module [item]`
    params: tuple[str, ...]  # params.yaml groups it reads
    inputs: tuple[Path, ...]  # data and artifacts it reads
    outs: tuple[Path, ...] = ()
    metrics: tuple[Path, ...] = ()
    # what dvc.yaml's top-level plots draw: a curves folder, a CSV (`titled_plots.py`)
    plots: tuple[Path, ...] = ()
    # what it measured: all of it to `details`; the numbers `headline` names (short key ->
    # dotted path) to its metrics file under those keys, what DVC's views show
    # (`metric_files.py`)
    headline: Mapping[str, str] = field(default_factory=dict)
    details: Path | None = None
    foreach: str | None = None  # params list the stage runs once per element of
    item: str | None = None  # that element, once filled in

    @property
    def address(self) -> str:
        """How DVC names it: `sft`, or `rl@ppo` for an element of a foreach stage."""
        return f"{self.name}@{self.item}" if self.item else self.name

    @property
    def outputs(self) -> tuple[Path, ...]:
        """Everything the stage writes: outs, metrics, their details and plots."""
        details = (self.details,) if self.details else ()
        return (*self.outs, *self.metrics, *details, *self.plots)

    @property
    def filed_as(self) -> str:
        return filed_as(self.address)

    @property
    def resume_file(self) -> Path:
        return paths.RESUME / f"{self.filed_as}.pt"

    @property
    def live_folder(self) -> Path:
        """Where its curve log writes while it trains (`rlhf.train.curves`)."""
        return paths.LIVE / self.filed_as

    def filled(self, item: str | None) -> StageSpec:
        """This stage as it runs: for a foreach stage, element `item` with every `${item}`
        filled in."""
        if (self.foreach is None) != (item is None):
            raise ValueError(
                f"stage {self.name} {'needs an' if item is None else 'takes no'} element"
            )
        if item is None:
            return self
        return replace(
            self,
            params=tuple(p.replace(ITEM, item) for p in self.params),
            inputs=tuple(_fill(p, item) for p in self.inputs),
            outs=tuple(_fill(p, item) for p in self.outs),
            metrics=tuple(_fill(p, item) for p in self.metrics),
            details=self.details and _fill(self.details, item),
            plots=tuple(_fill(p, item) for p in self.plots),
            item=item,
        )


# a trained model's headline: its validation loss and its accuracy on the validation pairs,
# by the gold judge where there is one (the task suite), else by the pairs' own labels
MODEL_HEADLINE = {"acc": "acc_gold|acc_noisy", "loss": "val_loss"}


def trained_outputs(name: str, headline: Mapping[str, str]) -> dict[str, object]:
    """Outputs of a stage trained by the shared loop: model, metrics (`headline` shown by
    DVC) and training curves (StageSpec keyword arguments)."""
    return {
        "outs": (paths.model_file(name),),
        "metrics": (paths.metrics_file(name),),
        "headline": headline,
        "details": paths.details_file(name),
        "plots": (paths.curves_folder(name),),
    }


def filed_as(address: str) -> str:
    """The name a stage's outputs go under, from its DVC address: the stage's (`sft`), or an
    RL stage's algorithm (`ppo` for `rl@ppo`)."""
    name, _, item = address.partition("@")
    return item or name


def _fill(path: Path, item: str) -> Path:
    return Path(str(path).replace(ITEM, item))
