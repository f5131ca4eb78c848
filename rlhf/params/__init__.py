"""Typed schema for `params.yaml`: `Params`, its groups (`groups.py`) and the checks across
them, on the machinery of `schema.py`.

Every hyperparameter of the pipeline lives in one YAML file, grouped by stage, so that DVC can
rerun exactly the stages whose groups changed. A typo in that file would otherwise be silently
ignored (and the run would use a default), so loading is strict: an unknown key, a wrong type or
an out-of-range value fails at once with the key, the bad value and what would be valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlhf import reward_sources
from rlhf.errors import ParamsError
from rlhf.params import schema
from rlhf.params.groups import (
    CHECKABLE_TASKS,
    RL_ALGORITHMS,
    TASK_FAMILIES,
    ParamsFile,
    PolicyOptimParams,
)
from rlhf.reward_sources import ENSEMBLE, JUDGES, LABELER, REWARD

# answers one person ranks at once, each named by a letter (rlhf.labeling.ranking.LETTERS,
# checked by a test; not imported, or every stage would depend on the labeling code)
MAX_ANSWERS_ON_SCREEN = 26
GOLD_FIXES = {  # what to set instead, by key, where the gold judge cannot score the prompts
    LABELER: "set collect.labeler to rm:PATH, hf:DIR, check:EXTRACTOR or human",
    REWARD: "set rl.reward to rm, hf:DIR, ensemble or check:EXTRACTOR",
    ENSEMBLE: "remove it from rl.ensemble",
    JUDGES: "remove it from evaluate.judges",
}


@dataclass(frozen=True)
class Params(ParamsFile):
    """Every param, as loaded: the declared file (`groups.ParamsFile`) with what ties its
    groups together, checked when it is built."""

    def algorithm(self, name: str) -> PolicyOptimParams:
        """The params group of RL algorithm `name`."""
        return getattr(self, name)

    def gold_judged(self) -> dict[str, str]:
        """The keys whose setting needs the task suite's gold judge, by key: it scores only
        task-suite prompts, so these cannot run on prompts of your own."""
        found = {}
        if self.collect.source == "policy" and self.labeler().needs_suite:
            found[LABELER] = self.collect.labeler
        if self.reward().needs_suite:
            found[REWARD] = self.rl.reward
        for spelled, member in self.ensemble_members():
            if member.needs_suite:
                found[ENSEMBLE] = spelled
        for spelled, judge in zip(self.evaluate.judges, self.judges(), strict=True):
            if judge.refused_off_suite:
                found[JUDGES] = spelled
        return found

    def checked(self) -> list[tuple[str, str]]:
        """(key, value) of each setting that checks answers against references: every prompt
        it scores must have one."""
        found = [(REWARD, self.rl.reward)] if self.reward().needs_references else []
        members = self.ensemble_members()
        found += [(ENSEMBLE, spelled) for spelled, member in members if member.needs_references]
        if self.collect.source == "policy" and self.labeler().needs_references:
            found.append((LABELER, self.collect.labeler))
        pairs = zip(self.evaluate.judges, self.judges(), strict=True)
        return found + [(JUDGES, spelled) for spelled, judge in pairs if judge.needs_references]

    def reward(self) -> reward_sources.Source:
        """`rl.reward` as a reward source."""
        return reward_sources.parse(self.rl.reward, REWARD)

    def ensemble_members(self) -> list[tuple[str, reward_sources.Source]]:
        """What `rl.reward: ensemble` combines with the reward model: each `rl.ensemble` entry
        as spelled and as a reward source; none for another reward (which reads no entry)."""
        if self.reward().kind.name != "ensemble":
            return []
        return [(member, reward_sources.parse(member, ENSEMBLE)) for member in self.rl.ensemble]

    def ensemble(self) -> list[reward_sources.Source]:
        """`ensemble_members`' sources, in their order."""
        return [source for _, source in self.ensemble_members()]

    def labeler(self) -> reward_sources.Source:
        """`collect.labeler` as a reward source."""
        return reward_sources.parse(self.collect.labeler, LABELER)

    def judges(self) -> list[reward_sources.Source]:
        """`evaluate.judges` as reward sources, in their order."""
        return [reward_sources.parse(judge, JUDGES) for judge in self.evaluate.judges]

    def answer_lengths(self) -> dict[str, int]:
        """Every answer-length cap by key: each must leave room for a prompt in the context."""
        return {
            "sft.eval_max_new_tokens": self.sft.eval_max_new_tokens,
            "collect.max_new_tokens": self.collect.max_new_tokens,
            "rl.max_new_tokens": self.rl.max_new_tokens,
            "evaluate.max_new_tokens": self.evaluate.max_new_tokens,
        }

    def __post_init__(self) -> None:
        pretrained = self.model.init != "scratch"
        if pretrained != (self.tokenizer.kind == "pretrained"):
            raise ParamsError(
                f"model.init = {self.model.init!r} needs tokenizer.kind: "
                + (
                    "pretrained (a pretrained model reads its own tokenizer)"
                    if pretrained
                    else "bpe, bytes or tiktoken "
                    "(`pretrained` reads a model.init folder's tokenizer)"
                )
            )
        if self.model.n_embd % self.model.n_head:
            raise ParamsError(
                f"model.n_head = {self.model.n_head} must divide model.n_embd = {self.model.n_embd}"
            )
        self.reward()  # raises naming the key and what it accepts
        labeler = self.labeler()
        people_rank = self.collect.source == "policy" and labeler.by_people
        if people_rank and self.collect.answers_per_item() > MAX_ANSWERS_ON_SCREEN:
            raise ParamsError(
                f"collect.labeler is human, but collect.k + include_demo + explore + mismatched "
                f"= {self.collect.answers_per_item()} answers per item are more than the "
                f"{MAX_ANSWERS_ON_SCREEN} letters that name them on screen (and more than a "
                "person ranks well; InstructGPT's labelers ranked 4 to 9)"
            )
        if not self.evaluate.judges:
            raise ParamsError(
                "evaluate.judges = []: name at least one of "
                + reward_sources.listing([k.spelling for k in reward_sources.accepted(JUDGES)])
            )
        self.judges()
        if self.data.source == "files":
            for key, value in self.gold_judged().items():
                raise ParamsError(
                    f"{key}: {value!r} needs the task suite's gold judge, which cannot score "
                    f"your own prompts (data.source: files): {GOLD_FIXES[key]}"
                )
        self._check_ensemble()
        unknown_rl = sorted(set(self.rl_algorithms) - set(RL_ALGORITHMS))
        if unknown_rl or len(set(self.rl_algorithms)) != len(self.rl_algorithms):
            raise ParamsError(
                f"rl_algorithms = {list(self.rl_algorithms)!r} must list distinct names of "
                f"{', '.join(RL_ALGORITHMS)}"
            )
        for key, length in self.answer_lengths().items():
            if length >= self.model.block_size:
                raise ParamsError(
                    f"{key} = {length} leaves no room for a prompt in model.block_size = "
                    f"{self.model.block_size} tokens: it must be smaller than that"
                )
        unknown = sorted(set(self.data.tasks) - set(TASK_FAMILIES))
        if unknown or not self.data.tasks:
            raise ParamsError(
                f"data.tasks = {list(self.data.tasks)!r} must be a non-empty list of "
                f"{', '.join(TASK_FAMILIES)}"
            )
        if self.data.source == "synthetic":
            for key, value in self.checked():
                extractor = value.partition(":")[2].strip()
                checkable = CHECKABLE_TASKS.get(extractor, ())
                unchecked = [t for t in self.data.tasks if t not in checkable]
                if unchecked:
                    raise ParamsError(
                        f"{key} names {value!r}, whose extractor finds no right answer of the "
                        f"tasks {', '.join(unchecked)} in data.tasks: every answer would score 0; "
                        + (f"set data.tasks to {list(checkable)}" if checkable else
                           "no task of the suite ends in an answer it reads")
                    )  # fmt: skip
        if self.rl.overlong_buffer >= self.rl.max_new_tokens:
            raise ParamsError(
                f"rl.overlong_buffer = {self.rl.overlong_buffer} must be smaller than "
                f"rl.max_new_tokens = {self.rl.max_new_tokens}: every answer would be penalized"
            )

    def _check_ensemble(self) -> None:
        """rl.reward: ensemble needs members; weighted_sum one weight per score it sums, and
        no other reduction reads weights (a weight set there would be silently ignored)."""
        rl = self.rl
        if self.reward().kind.name == "ensemble" and not rl.ensemble:
            raise ParamsError(
                "rl.reward = 'ensemble' needs reward sources in rl.ensemble "
                "(rm:PATH, hf:DIR, rule:NAME or check:EXTRACTOR)"
            )
        self.ensemble()  # raises naming the key, the entry and what it accepts
        if rl.ensemble_reduce != "weighted_sum":
            if rl.ensemble_weights:
                raise ParamsError(
                    f"rl.ensemble_weights = {list(rl.ensemble_weights)} is read only by "
                    f"rl.ensemble_reduce: weighted_sum, not {rl.ensemble_reduce!r}: set that, "
                    "or empty the weights"
                )
        elif len(rl.ensemble_weights) != 1 + len(rl.ensemble):
            raise ParamsError(
                f"rl.ensemble_weights = {list(rl.ensemble_weights)} must hold "
                f"{1 + len(rl.ensemble)} weights for rl.ensemble_reduce: weighted_sum: the "
                f"reward model's, then one for each of the {len(rl.ensemble)} rl.ensemble "
                "entries"
            )


def parse_params(raw: Any, source: str = "params") -> Params:
    """Validate a mapping (as read from YAML) against the schema; missing keys take defaults."""
    return schema.build(Params, raw or {}, "", source)


def load_params(path: str | Path) -> Params:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from exc
    return parse_params(raw, str(path))


def describe() -> list[tuple[str, str, Any]]:
    """(key, doc, default) for every key of params.yaml, for `rlhf params` and the README."""
    return schema.describe(Params)
