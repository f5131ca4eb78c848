"""Folders outside the pipeline's own outputs that params name: inputs DVC must track too.

The pretrained model `model.init` names (read by the tokenizer and SFT stages), an external
reward model `rl.reward: hf:DIR` names (read by the RL stages) and the reward models among
`evaluate.judges` (read by the evaluation), and the reward model `collect.labeler` names (read
by the collect stage). dvc.yaml's deps are fixed when
`rlhf dvc-yaml` writes it, so such a folder joins the deps of the stages that read it then. A
stage started on a folder dvc.yaml does not list refuses to run: otherwise new weights in the
folder would leave every result "up to date".
"""

from __future__ import annotations

from pathlib import Path

import yaml

from rlhf.params import Params, ParamsError

DVC_FILE = Path("dvc.yaml")
HF_REWARD = "hf:"  # rl.reward's prefix for a reward model folder in Hugging Face layout
LABELER_CHECKPOINT = "rm:"  # collect.labeler's prefix for a reward-model checkpoint


def init_folder(params: Params) -> Path | None:
    """The folder the policy starts from, or None for a model trained from scratch."""
    return None if params.model.init == "scratch" else Path(params.model.init)


def reward_folder(params: Params) -> Path | None:
    """The external reward model's folder `rl.reward: hf:DIR` names, if it names one."""
    reward = params.rl.reward
    return Path(reward.removeprefix(HF_REWARD)) if reward.startswith(HF_REWARD) else None


def judge_folder(judge: str) -> Path | None:
    """The folder of an `evaluate.judges` entry `hf:DIR`, if it names one."""
    return Path(judge.removeprefix(HF_REWARD)) if judge.startswith(HF_REWARD) else None


def labeler_path(params: Params) -> Path | None:
    """The reward model `collect.labeler: rm:PATH | hf:DIR` names, if it names one."""
    labeler = params.collect.labeler
    for prefix in (LABELER_CHECKPOINT, HF_REWARD):
        if labeler.startswith(prefix):
            return Path(labeler.removeprefix(prefix))
    return None


def tracked_folders(params: Params) -> dict[str, tuple[Path, ...]]:
    """By dvc.yaml stage name, the folders (or checkpoint files) of this kind it reads."""
    init, reward = init_folder(params), reward_folder(params)
    judges = tuple(judge_folder(j) for j in params.evaluate.judges)
    reads = {
        "tokenizer": (init,),
        "sft": (init,),
        "collect": (labeler_path(params),),
        "rl": (reward,),
        "evaluate": judges,
    }
    return {stage: tuple(f for f in folders if f) for stage, folders in reads.items()}


def require_tracked(stage: str, folder: Path, key: str) -> None:
    """Refuse to read `folder` (named by params `key`) in `stage` when dvc.yaml does not list
    it among the stage's deps; a run outside DVC, with no dvc.yaml, is not checked."""
    if not folder.exists():
        raise ParamsError(f"{key} names {str(folder)!r}: no such file or folder")
    if not DVC_FILE.is_file():
        return
    entry = yaml.safe_load(DVC_FILE.read_text())["stages"].get(stage, {})
    if str(folder) not in entry.get("do", entry).get("deps", []):
        raise ParamsError(
            f"{key} names {str(folder)!r}, which is not among stage {stage}'s deps in "
            f"{DVC_FILE}: run `rlhf dvc-yaml` so that DVC tracks the folder, then run again"
        )
