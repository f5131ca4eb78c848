"""Sequence-level reward sources for RL: a reward model, one trained elsewhere, a rule, or an
ensemble of RMs.

Every source maps (prompts, responses) text to one score per response. Scoring text rather
than the policy's token ids means a reward model sees exactly the tokenization it was trained
on, and rules and models share one interface.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from rlhf.algorithms.reward_model import score
from rlhf.algorithms.rules import RULES
from rlhf.data.tokenizer import Tokenizer, pretrained_tokenizer
from rlhf.models import checkpoint, hf
from rlhf.models.backbone import Backbone, freeze
from rlhf.params import ParamsError
from rlhf.prefixed import HF, RULE, argument

Scorer = Callable[[Sequence[str], Sequence[str]], Tensor]


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
class EnsembleScorer:
    """Several reward models' normalized scores, averaged or (against hacking) their minimum:
    a policy exploiting one model's blind spot gets no credit the others do not also give."""

    members: list[Scorer]
    reduce: str = "min"

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> Tensor:
        scores = torch.stack([m(prompts, responses) for m in self.members])  # [M, B]
        return scores.min(0).values if self.reduce == "min" else scores.mean(0)


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
    if model_type in hf.FAMILIES:
        return ExternalRewardScorer.load(folder, device, bf16)
    from rlhf.algorithms.transformers_scorer import TransformersRewardScorer

    return TransformersRewardScorer.load(folder, str(model_type), device, bf16)


def make_scorer(
    reward: str,
    tokenizer: Tokenizer,
    device: torch.device,
    rm_path: str | Path,
    ensemble: Sequence[str | Path] = (),
    reduce: str = "min",
    frozen_bf16: bool = False,
) -> Scorer:
    """The reward source `rl.reward` names: `rm`, `hf:DIR`, `rule:NAME` or `ensemble`;
    `frozen_bf16` loads an external reward model in bfloat16 on CUDA."""
    if (folder := argument(reward, (HF,))) is not None:
        return external_scorer(Path(folder), device, frozen_bf16)
    if reward == "rm":
        return RewardModelScorer.load(rm_path, tokenizer, device)
    if reward == "ensemble":
        paths = [rm_path, *ensemble]
        return EnsembleScorer([RewardModelScorer.load(p, tokenizer, device) for p in paths], reduce)
    name = argument(reward, (RULE,))
    if name not in RULES:
        raise ParamsError(
            f"rl.reward = {reward!r} is not 'rm', 'hf:DIR', 'ensemble' or one of "
            + ", ".join(f"'rule:{n}'" for n in RULES)
        )
    return RuleScorer(RULES[name])
