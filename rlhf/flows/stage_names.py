"""The stages a flow can be asked for, as an enum, so that Prefect's UI and
`prefect deployment run -p stage=...` offer exactly the DVC stage names instead of free text.

Built from the stage list without importing the stages (the flow's container imports no
torch to start): every stage, with the foreach stage `rl` spelled out once per RL algorithm
the params accept. A test checks this against the stage declarations themselves.
"""

from __future__ import annotations

from enum import Enum

from rlhf.project.stage_list import STAGES


def stage_names() -> list[str]:
    """Every addressable stage, in pipeline order."""
    names: list[str] = []
    for stage in STAGES:
        names += [f"{stage.name}@{item}" for item in stage.items] if stage.items else [stage.name]
    return names


StageName = Enum("StageName", {name: name for name in stage_names()}, type=str)
