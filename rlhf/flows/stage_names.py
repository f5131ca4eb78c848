"""The stages a flow can be asked for, as an enum, so that Prefect's UI and
`prefect deployment run -p stage=...` offer exactly the DVC stage names instead of free text.

Built from the stage modules' names without importing them (the flow's container imports no
torch to start): every stage, with the foreach stage `rl` spelled out once per RL algorithm
the params accept. A test checks this against the stage declarations themselves.
"""

from __future__ import annotations

from enum import Enum

from rlhf.params import RL_ALGORITHMS
from rlhf.stages.dvcfile import STAGE_MODULES

FOREACH_ITEMS = {"rl": RL_ALGORITHMS}  # stage -> the elements DVC names it by (`rl@ppo`)


def stage_names() -> list[str]:
    """Every addressable stage, in pipeline order."""
    names: list[str] = []
    for module in STAGE_MODULES:
        stage = module.rsplit(".", 1)[1]
        items = FOREACH_ITEMS.get(stage)
        names += [f"{stage}@{item}" for item in items] if items else [stage]
    return names


StageName = Enum("StageName", {name: name for name in stage_names()}, type=str)
