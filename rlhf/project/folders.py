"""Folders outside the pipeline's own outputs that params name: inputs DVC must track too.

The pretrained model `model.init` names (read by the tokenizer and SFT stages), an external
reward model `rl.reward: hf:DIR` names and the reward models among `rl.ensemble` (read by
the RL stages), the reward models among `evaluate.judges` (read by the evaluation), and what
`collect.labeler` names (read by the collect stage): a reward model, or for `human` the folder
of people's labels. dvc.yaml's deps are fixed when `rlhf dvc-yaml` writes it, so such a folder
joins the deps of the stages that read it then. A stage started on a folder dvc.yaml does not
list refuses to run: otherwise new weights in the folder would leave every result "up to
date".
"""

from __future__ import annotations

from pathlib import Path

import yaml

from rlhf.params import Params, ParamsError
from rlhf.project import paths

DVC_FILE = Path("dvc.yaml")


def init_folder(params: Params) -> Path | None:
    """The folder the policy starts from, or None for a model trained from scratch."""
    return None if params.model.init == "scratch" else Path(params.model.init)


def labeler_path(params: Params) -> Path | None:
    """What `collect.labeler` reads: the reward model `rm:PATH | hf:DIR` names, or for
    `human` the folder of people's labels."""
    labeler = params.labeler()
    return paths.LABELS if labeler.by_people else labeler.path


def tracked_folders(params: Params) -> dict[str, tuple[Path, ...]]:
    """By dvc.yaml stage name, the folders (or checkpoint files) of this kind it reads."""
    init = init_folder(params)
    reads = {
        "tokenizer": (init,),
        "sft": (init,),
        "collect": (labeler_path(params),),
        "rl": (params.reward().path, *(member.path for member in params.ensemble())),
        "evaluate": tuple(judge.path for judge in params.judges()),
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


LABELS_README = """\
People's rankings of labeling/queue.parquet, one Parquet file per labeler, written by
`rlhf label --labeler NAME`. This folder is a DVC dep of the collect stage
(`collect.labeler: human`): new labels make `dvc repro` collect them. Commit it.
"""


def create_labels_folder(params: Params) -> bool:
    """For `collect.labeler: human`, create the labels folder dvc.yaml lists among collect's
    deps (with a README, so git keeps it before the first label): DVC refuses to run a stage
    whose dep is missing. True when it was created."""
    if not params.labeler().by_people or paths.LABELS.exists():
        return False
    paths.LABELS.mkdir(parents=True)
    (paths.LABELS / "README.md").write_text(LABELS_README)
    return True
