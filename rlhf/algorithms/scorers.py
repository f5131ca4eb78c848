"""Building the scorers of reward sources and judges: one builder per kind of
`rlhf.reward_sources.KINDS` that a program scores (the RL reward, collect's labeler, the
evaluation's judges).

A single-answer scorer maps (prompts, responses) text to one score per response; a pairwise
judge maps (prompts, first answers, second answers) to one verdict per pair: 1 where the first
is better, 0 where the second is, 0.5 for a tie. Scoring text rather than the policy's token
ids means a reward model sees exactly the tokenization it was trained on, and rules and models
share one interface.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from rlhf.algorithms import answer_check
from rlhf.algorithms.reward_model import score
from rlhf.algorithms.rules import PAIR_RULES, RULES
from rlhf.models import checkpoint, hf, registry
from rlhf.models.backbone import Backbone, freeze
from rlhf.reward_sources import Source
from rlhf.tokenizer.tokenizer import Tokenizer, pretrained_tokenizer

Scorer = Callable[[Sequence[str], Sequence[str]], Tensor]  # prompts, answers -> [B] scores
# prompts, first answers, second answers -> [B] verdicts in {0, 0.5, 1}
PairJudge = Callable[[Sequence[str], Sequence[str], Sequence[str]], Tensor]


@dataclass
class RewardModelScorer:
    """A trained reward model, its score divided by the std it recorded on demonstrations.

    The head's bias was shifted at training time so demonstrations average 0; dividing by the
    std puts reward models of any scale on one scale, so `kl_coef` means the same for each.
    """

    model: Backbone
    tokenizer: Tokenizer
    pooling: str
    std: float
    batch_size: int = 256

    @classmethod
    def load(
        cls, path: str | Path, tokenizer: Tokenizer, device: torch.device
    ) -> RewardModelScorer:
        model, payload = checkpoint.load_model(path, tokenizer, device)
        if payload.get("kind") != "reward":
            raise ValueError(f"{path} is a {payload.get('kind')} checkpoint, not a reward model")
        return cls(model, tokenizer, payload["pooling"], float(payload["reward_std"]))

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> Tensor:
        raw = score(
            self.model,
            self.tokenizer,
            prompts,
            responses,
            pooling=self.pooling,
            batch_size=self.batch_size,
        )
        return raw / max(self.std, 1e-6)


@dataclass
class ExternalRewardScorer:
    """A reward model trained elsewhere: a one-label `*ForSequenceClassification` folder in
    Hugging Face layout of a family we have a backbone for (GPT-2, Llama or Qwen; others go
    through transformers, `transformers_scorer.py`), which reads each conversation through its
    own tokenizer and chat template and scores it at the last token, as transformers does. Its
    raw score is the reward: its scale is the model's own, so `kl_coef` is tuned to it."""

    model: Backbone
    tokenizer: Tokenizer
    batch_size: int = 64

    @classmethod
    def load(
        cls, folder: str | Path, device: torch.device, bf16: bool = False
    ) -> ExternalRewardScorer:
        tokenizer = pretrained_tokenizer(folder)
        return cls(freeze(hf.load_folder(folder, device), bf16), tokenizer)

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> Tensor:
        return score(
            self.model, self.tokenizer, prompts, responses, pooling="last",
            batch_size=self.batch_size,
        ).float()  # fmt: skip


@dataclass
class RuleScorer:
    rule: Callable[[str, str], float]

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> Tensor:
        return torch.tensor(
            [self.rule(p, r) for p, r in zip(prompts, responses, strict=True)], dtype=torch.float32
        )


@dataclass
class CheckScorer:
    """The answer checker (`rlhf.algorithms.answer_check`): 1 for the reference's final answer,
    `format_reward` for another the extractor found, 0 for none. It scores only prompts it has
    a reference for; the stages refuse others before anything loads (`require_references`)."""

    references: Mapping[str, str | None]  # prompt -> its reference answer
    extractor: str
    format_reward: float = 0.0

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> Tensor:
        scores = []
        for prompt, response in zip(prompts, responses, strict=True):
            reference = self.references.get(prompt)
            if reference is None:
                raise ValueError(f"no reference answer to check against for {prompt[:60]!r}")
            scores.append(
                answer_check.reward(response, reference, self.extractor, self.format_reward)
            )
        return torch.tensor(scores, dtype=torch.float32)


@dataclass
class EnsembleScorer:
    """Several scorers' scores combined: their minimum (against hacking: a policy exploiting
    one reward model's blind spot gets no credit the others do not also give), their mean, or
    a weighted sum (a reward model's normalized score plus an answer checker's 0 or 1, so
    that a right final answer counts beside everything the reward model judges)."""

    members: list[Scorer]
    reduce: str = "min"
    weights: Sequence[float] = ()  # `weighted_sum`: one per member

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> Tensor:
        scores = torch.stack([m(prompts, responses).float() for m in self.members])  # [M, B]
        if self.reduce == "min":
            return scores.min(0).values
        if self.reduce == "mean":
            return scores.mean(0)
        if len(self.weights) != len(self.members):
            raise ValueError(f"{len(self.weights)} weights for {len(self.members)} scorers")
        return torch.tensor(self.weights, dtype=scores.dtype) @ scores  # [M] @ [M, B] -> [B]


def backbones(scorer: Scorer) -> list[Backbone]:
    """The backbones of ours a scorer runs: none for a rule or a transformers model."""
    if isinstance(scorer, EnsembleScorer):
        return [model for member in scorer.members for model in backbones(member)]
    model = getattr(scorer, "model", None)
    return [model] if isinstance(model, Backbone) else []


def external_scorer(folder: Path, device: torch.device, bf16: bool = False) -> Scorer:
    """A reward model folder in Hugging Face layout: through our own backbones where we have
    its family, else through transformers (the `[hf]` extra), imported only here."""
    model_type = hf.read_config(folder).get("model_type")
    if registry.reading(model_type) is not None:
        return ExternalRewardScorer.load(folder, device, bf16)
    from rlhf.algorithms.transformers_scorer import TransformersRewardScorer

    return TransformersRewardScorer.load(folder, str(model_type), device, bf16)


@dataclass
class PreferenceJudge:
    """A single-answer scorer used pairwise: the first answer wins where it scores higher.

    For a reward model this is its own Bradley-Terry preference, P(first > second) =
    sigmoid(r_first - r_second), decided at 1/2. Each side is scored in its own call, so a
    reward model batches each policy's answers as it does when it scores them alone, and the
    verdicts agree exactly with the single-answer win rates.
    """

    scorer: Scorer

    def __call__(
        self, prompts: Sequence[str], first: Sequence[str], second: Sequence[str]
    ) -> Tensor:
        if not len(prompts) == len(first) == len(second):
            raise ValueError(f"{len(prompts)} prompts, {len(first)} and {len(second)} answers")
        a, b = self.scorer(prompts, first), self.scorer(prompts, second)  # [B] each
        # decided as win_rates.outcomes decides single scores (a NaN score loses)
        return torch.where(a > b, 1.0, torch.where(a == b, 0.5, 0.0))


@dataclass
class PairRuleJudge:
    rule: Callable[[str, str, str], float]

    def __call__(
        self, prompts: Sequence[str], first: Sequence[str], second: Sequence[str]
    ) -> Tensor:
        triples = zip(prompts, first, second, strict=True)
        return torch.tensor([self.rule(p, a, b) for p, a, b in triples], dtype=torch.float32)


@dataclass
class ScoringContext:
    """What a builder reads besides its source's argument. The pipeline's reward model is
    loaded once, however many sources use it (`rm`, `ensemble`, `pairwise:rm`)."""

    tokenizer: Tokenizer
    device: torch.device
    reward_model_path: str | Path  # the reward model the pipeline trained
    ensemble: Sequence[Source] = ()  # rl.ensemble: what scores beside the reward model
    ensemble_reduce: str = "min"
    ensemble_weights: Sequence[float] = ()  # `weighted_sum`: the reward model's, then each's
    frozen_bf16: bool = False  # external reward models in bfloat16 on CUDA
    references: Mapping[str, str | None] = field(default_factory=dict)  # prompt -> reference
    format_reward: float = 0.0  # the checker's reward for a wrong answer in the right format
    _reward_model: RewardModelScorer | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def reward_model(self) -> RewardModelScorer:
        if self._reward_model is None:
            self._reward_model = RewardModelScorer.load(
                self.reward_model_path, self.tokenizer, self.device
            )
        return self._reward_model

    def checkpoint(self, path: str | Path) -> RewardModelScorer:
        return RewardModelScorer.load(path, self.tokenizer, self.device)


def _ensemble(source: Source, context: ScoringContext) -> Scorer:
    members = [context.reward_model(), *(build(member, context) for member in context.ensemble)]
    return EnsembleScorer(members, context.ensemble_reduce, context.ensemble_weights)


# by rlhf.reward_sources kind: what scores for it (a test ties the two tables); the gold judge
# is the task suite's own (`gold_score`) and `human` is people, so neither has a builder.
# A kind that takes an argument always has one here (`parse` refuses the value otherwise).
BUILDERS: dict[str, Callable[[Source, ScoringContext], Scorer | PairJudge]] = {
    "rm": lambda source, context: context.reward_model(),
    "checkpoint": lambda source, context: context.checkpoint(source.path),
    "hf": lambda source, context: external_scorer(source.path, context.device, context.frozen_bf16),
    "ensemble": _ensemble,
    "rule": lambda source, context: RuleScorer(RULES[source.argument]),
    "check": lambda source, context: CheckScorer(
        context.references, source.argument, context.format_reward
    ),
    "pairwise_rm": lambda source, context: PreferenceJudge(context.reward_model()),
    "pairwise_rule": lambda source, context: PairRuleJudge(PAIR_RULES[source.argument]),
}


def build(source: Source, context: ScoringContext) -> Scorer | PairJudge:
    """The scorer (or, for a pairwise source, the judge) that `source` names."""
    return BUILDERS[source.kind.name](source, context)
