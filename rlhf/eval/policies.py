"""Sampling a policy on evaluation prompts and measuring every answer.

KL(policy || reference) per answer is estimated from the policy's own samples as the sum over
answer tokens of log p_policy - log p_reference: unbiased, and the quantity the KL penalty of
RLHF bounds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from rlhf.data.tokenizer import Tokenizer
from rlhf.eval.gold import gold_summary, has_judge
from rlhf.eval.win_rates import win_rate
from rlhf.models.backbone import Backbone
from rlhf.sampling.forward import response_forward
from rlhf.sampling.rollout import sample_rollout
from rlhf.sampling.sampler import SamplingConfig

if TYPE_CHECKING:
    from rlhf.algorithms.scorers import Scorer

# the RL stage's gold-judged keys: None on prompts from outside the task suite
GOLD_VS_REFERENCE = (
    "gold_sampled", "gold_sampled_sft", "gold_sampled_by_task", "gold_sampled_sft_by_task",
    "win_rate_vs_sft",
)  # fmt: skip


@dataclass
class PolicySamples:
    prompts: list[str]  # each evaluation prompt `n` times, in order
    responses: list[str]
    kl_to_reference: list[float]  # per answer; empty without a reference
    lengths: list[int] = field(default_factory=list)  # answer tokens, the end token included
    ended: list[bool] = field(default_factory=list)  # the answer emitted the end token


@torch.no_grad()
def sample_policy(
    policy: Backbone,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    *,
    n: int,
    config: SamplingConfig,
    seed: int,
    batch_size: int,
    reference: Backbone | None = None,
) -> PolicySamples:
    """`n` answers per prompt, batched; the same seed gives the same answers."""
    device = next(policy.parameters()).device
    generator = torch.Generator(device).manual_seed(seed)
    samples = PolicySamples([p for p in prompts for _ in range(n)], [], [])
    for start in range(0, len(samples.prompts), batch_size):
        rollout = sample_rollout(
            policy, tokenizer, samples.prompts[start : start + batch_size], config, generator
        )
        samples.responses += rollout.responses
        samples.lengths += rollout.lengths.tolist()
        samples.ended += rollout.ended.tolist()
        if reference is not None:
            ref = response_forward(
                reference,
                rollout.sequences,
                rollout.attention_mask,
                rollout.prompt_width,
                config.temperature,
            )
            per_token = torch.where(rollout.response_mask, rollout.logprobs - ref.logprobs, 0.0)
            samples.kl_to_reference += per_token.sum(-1).tolist()
    return samples


Judge = Callable[[str, str], float]
# summary name -> per-answer field
MEASURES = {
    "gold": "gold",
    "reward": "reward",
    "kl": "kl",
    "length": "length",
    "end_token_rate": "ended",
}


@dataclass
class ScoredAnswers:
    """One policy's answers to the evaluation prompts, with what was measured on each."""

    prompt_index: list[int]  # which evaluation prompt each answer answers
    tasks: list[str]
    responses: list[str]
    gold: list[float] | None  # None when the prompts have no gold judge
    reward: list[float]  # reward model, normalized as PPO sees it
    kl: list[float]  # to the reference policy
    length: list[int]
    ended: list[bool]

    def _mean(self, measure: str, rows: Sequence[int]) -> float | None:
        values = getattr(self, MEASURES[measure])
        if values is None:
            return None
        return round(sum(float(values[i]) for i in rows) / len(rows), 4)

    def means(self) -> dict[str, float | None]:
        """Every measure averaged over all answers."""
        rows = range(len(self.responses))
        return {m: self._mean(m, rows) for m in MEASURES}

    def by_task(self) -> dict[str, dict[str, float | None]]:
        """Every measure averaged within each task family."""
        rows: defaultdict[str, list[int]] = defaultdict(list)
        for i, task in enumerate(self.tasks):
            rows[task].append(i)
        return {t: {m: self._mean(m, r) for m in MEASURES} for t, r in sorted(rows.items())}


def score_policy(
    policy: Backbone,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    tasks: Sequence[str],
    *,
    reference: Backbone,
    scorer: Scorer,
    judge: Judge | None,
    n: int,
    config: SamplingConfig,
    seed: int,
    batch_size: int,
) -> ScoredAnswers:
    """Sample `n` answers per prompt and measure each: gold, reward, KL, length, ending.

    The reference itself gets a KL of exactly 0 without a second forward pass.
    """
    samples = sample_policy(
        policy, tokenizer, prompts, n=n, config=config, seed=seed, batch_size=batch_size,
        reference=None if policy is reference else reference,
    )  # fmt: skip
    responses = samples.responses
    pairs = zip(samples.prompts, responses, strict=True)
    return ScoredAnswers(
        prompt_index=[i for i in range(len(prompts)) for _ in range(n)],
        tasks=[t for t in tasks for _ in range(n)],
        responses=responses,
        gold=None if judge is None else [judge(p, r) for p, r in pairs],
        reward=scorer(samples.prompts, responses).tolist(),
        kl=samples.kl_to_reference or [0.0] * len(responses),
        length=samples.lengths,
        ended=samples.ended,
    )


def versus_reference(
    policy: Backbone,
    reference: Backbone,
    tokenizer: Tokenizer,
    heldout: Sequence[dict[str, Any]],
    *,
    samples: int,
    max_new_tokens: int,
    seed: int,
    batch_size: int,
) -> dict[str, Any]:
    """KL to the reference on held-out prompts, `samples` answers per prompt at temperature 1,
    and where the gold judge applies (prompts from the task suite) the gold score of both
    policies, sampled with the same seed, and the win rate over the reference (ties half).
    Without a judge those keys stay, as None, so every run's metrics have the same keys."""
    config = SamplingConfig(max_new_tokens=max_new_tokens)
    prompts = [r["prompt"] for r in heldout]
    common: dict[str, Any] = dict(n=samples, config=config, seed=seed, batch_size=batch_size)
    policy_samples = sample_policy(policy, tokenizer, prompts, reference=reference, **common)
    kl = policy_samples.kl_to_reference
    gold: dict[str, Any] = dict.fromkeys(GOLD_VS_REFERENCE)
    if has_judge(heldout):
        tasks = [r["task"] for r in heldout for _ in range(samples)]
        reference_samples = sample_policy(reference, tokenizer, prompts, **common)
        mine = gold_summary(policy_samples.prompts, tasks, policy_samples.responses)
        theirs = gold_summary(reference_samples.prompts, tasks, reference_samples.responses)
        gold = {
            "gold_sampled": mine["mean"],
            "gold_sampled_sft": theirs["mean"],
            "gold_sampled_by_task": mine["by_task"],
            "gold_sampled_sft_by_task": theirs["by_task"],
            "win_rate_vs_sft": round(win_rate(mine["scores"], theirs["scores"]), 4),
        }
    return gold | {"kl_to_sft": round(sum(kl) / len(kl), 4)}
