"""Reward sources and judges: one registry of everything a params value can name to score
answers.

`rl.reward` (what the RL stages maximize), `rl.ensemble` (what `rl.reward: ensemble` combines
with the reward model), `collect.labeler` (who ranks collect's answers) and `evaluate.judges`
(who decides the win rates) name their scorers with the same spellings:
`gold`, `rm`, `hf:DIR`, `rule:NAME`, `check:EXTRACTOR`, ... Each kind here says how it is
spelled, which keys accept it, what it reads (the task suite, the trained reward model, a
folder or checkpoint DVC must track, people's labels, the prompts' references) and whether it
scores one answer or compares two. params validation, dvc.yaml's deps and the stages all read
this table.

It is light on purpose (no torch, no models): every stage imports the params, and what a stage
imports is what dvc.yaml makes it depend on. Building a kind's scorer is the job of
`rlhf.algorithms.scorers.BUILDERS`, one builder per kind here but the gold judge (the task
suite's own) and people (a test ties the two), which only the stages that score import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from rlhf.errors import ParamsError

GOLD = "gold"
REWARD_MODEL = "rm"
REWARD = "rl.reward"
ENSEMBLE = "rl.ensemble"
LABELER = "collect.labeler"
JUDGES = "evaluate.judges"
LIST_KEYS = {ENSEMBLE, JUDGES}  # keys whose value is a list of sources, each read on its own

# What a kind reads besides the prompts and answers:
# `suite`: the task suite's gold judge, so task-suite prompts only;
# `reward_model`: the reward model the pipeline trained (a stage output);
# `path`: the file or folder its argument names, outside the pipeline: a dep DVC must track;
# `labels`: the folder of people's rankings (`rlhf label`);
# `references`: each prompt's reference answer (the prompts' `reference` column).
Reads = Literal["suite", "reward_model", "path", "labels", "references"]


@dataclass(frozen=True)
class SourceKind:
    name: str  # the registry key, and BUILDERS' key
    word: str  # what the spelling starts with: `hf` in `hf:DIR`
    argument: str | None  # the argument's placeholder (`DIR`), None for a bare word
    keys: frozenset[str]  # the params keys that accept it
    reads: Reads | None
    description: str  # what it is; `{}` takes the argument
    pairwise: bool = False  # compares two answers rather than scoring one
    choices: tuple[str, ...] = ()  # the arguments it accepts, when they are names
    choice_noun: str = ""  # what one choice is called in an error: `rule`

    @property
    def spelling(self) -> str:
        return self.word if self.argument is None else f"{self.word}:{self.argument}"


RULES = ("contains_number", "gold")  # rlhf.algorithms.rules.RULES' names, checked by a test
PAIR_RULES = ("shorter",)  # rlhf.algorithms.rules.PAIR_RULES' names, checked by a test
SUITE_RULE = "gold"  # the rule that is the task suite's gold judge
# rlhf.algorithms.answer_check.EXTRACTORS' names, checked by a test
CHECK_EXTRACTORS = ("last_number", "gsm8k", "boxed")

# In this order in every error message and doc that lists them.
KINDS = {
    kind.name: kind
    for kind in (
        SourceKind(
            GOLD, GOLD, None, frozenset({LABELER, JUDGES}), "suite",
            "the task suite's programmatic judge, playing the human labeler",
        ),
        SourceKind(
            "human", "human", None, frozenset({LABELER}), "labels",
            "people, ranking the answers in `rlhf label`",
        ),
        SourceKind(
            REWARD_MODEL, REWARD_MODEL, None, frozenset({REWARD, JUDGES}), "reward_model",
            "the trained reward model: the proxy the RL policies optimized, so it flatters them",
        ),
        SourceKind(
            "checkpoint", "rm", "PATH", frozenset({LABELER, ENSEMBLE}), "path",
            "the reward-model checkpoint {}, of an earlier run",
        ),
        SourceKind(
            "hf", "hf", "DIR", frozenset({REWARD, ENSEMBLE, LABELER, JUDGES}), "path",
            "the reward model in {}, trained elsewhere",
        ),
        SourceKind(
            "ensemble", "ensemble", None, frozenset({REWARD}), "reward_model",
            "the trained reward model and the sources of rl.ensemble, their minimum, mean or "
            "weighted sum (rl.ensemble_reduce)",
        ),
        SourceKind(
            "rule", "rule", "NAME", frozenset({REWARD, ENSEMBLE, JUDGES}), None,
            "the reward function {}", choices=RULES, choice_noun="rule",
        ),
        SourceKind(
            "check", "check", "EXTRACTOR", frozenset({REWARD, ENSEMBLE, LABELER, JUDGES}),
            "references",
            "the answer checker: the final answer ({} extractor) against the prompt's "
            "reference, 1 or 0", choices=CHECK_EXTRACTORS, choice_noun="extractor",
        ),
        SourceKind(
            "pairwise_rm", "pairwise:rm", None, frozenset({JUDGES}), "reward_model",
            "the trained reward model shown both answers: the one it prefers under its "
            "Bradley-Terry model wins", pairwise=True,
        ),
        SourceKind(
            "pairwise_rule", "pairwise:rule", "NAME", frozenset({JUDGES}), None,
            "the pairwise rule {}", pairwise=True, choices=PAIR_RULES,
            choice_noun="pairwise rule",
        ),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Source:
    """A params value read as a reward source or judge: its kind and its argument."""

    kind: SourceKind
    argument: str | None  # what follows the kind's word: DIR, PATH or NAME

    @property
    def pairwise(self) -> bool:
        return self.kind.pairwise

    @property
    def path(self) -> Path | None:
        """The file or folder outside the pipeline it reads, which DVC must track."""
        return Path(self.argument) if self.kind.reads == "path" and self.argument else None

    @property
    def needs_references(self) -> bool:
        """Whether it scores against each prompt's reference answer, which every prompt it
        scores must then have."""
        return self.kind.reads == "references"

    @property
    def by_people(self) -> bool:
        """Whether people score (rank answers in `rlhf label`) rather than a program."""
        return self.kind.reads == "labels"

    @property
    def needs_suite(self) -> bool:
        """Whether it scores task-suite prompts only (the gold judge, or the gold rule)."""
        return self.kind.reads == "suite" or (
            self.kind.name == "rule" and self.argument == SUITE_RULE
        )

    @property
    def refused_off_suite(self) -> bool:
        """Whether prompts from outside the task suite refuse it: a rule that is the gold
        judge, where `gold` itself, a judge among others, is skipped there."""
        return self.needs_suite and self.kind.reads != "suite"

    def describe(self) -> str:
        return self.kind.description.format(self.argument)


def listing(spellings: list[str]) -> str:
    """`'a', 'b' or 'c'`."""
    quoted = [f"'{s}'" for s in spellings]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def accepted(key: str) -> list[SourceKind]:
    """The kinds params `key` accepts, in the registry's order."""
    return [kind for kind in KINDS.values() if key in kind.keys]


def _match(value: str, kind: SourceKind) -> str | Literal[False] | None:
    """The argument when `value` is spelled as `kind` (None for a bare word), else False;
    spaces after a colon do not count (`rule: gold` is `rule:gold`)."""
    rest = value
    for depth, part in enumerate(kind.word.split(":")):
        head, colon, rest = rest.partition(":")
        if (head.lstrip() if depth else head) != part:
            return False
    if kind.argument is None:
        return None if not colon else False
    return rest.strip() if colon and rest.strip() else False


@cache
def parse(value: str, key: str) -> Source:
    """`value` under params `key` as a source, or a ParamsError naming the key and listing
    what the key accepts (or, for a name the kind does not have, the names it has)."""
    for kind in accepted(key):
        argument = _match(value, kind)
        if argument is False:
            continue
        if kind.choices and argument not in kind.choices:
            raise ParamsError(
                f"{key}: {value!r} names no {kind.choice_noun}; the {kind.choice_noun}s are "
                + ", ".join(f"'{kind.word}:{name}'" for name in kind.choices)
            )
        return Source(kind, argument)
    named = f"{key}: {value!r}" if key in LIST_KEYS else f"{key} = {value!r}"
    raise ParamsError(f"{named} is not " + listing([kind.spelling for kind in accepted(key)]))


def applicable(judges: Sequence[str], has_suite: bool) -> list[str]:
    """The `evaluate.judges` that can judge these prompts: `gold` only on the task suite."""
    return [j for j in judges if has_suite or parse(j, JUDGES).kind.reads != "suite"]
