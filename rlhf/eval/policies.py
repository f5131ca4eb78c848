"""Sampling a policy on evaluation prompts and measuring every answer.

KL(policy || reference) per answer is the sum over its tokens of the full-vocabulary KL of the
two next-token distributions (the policy's at its sampling temperature, the reference as it
is): never negative, its mean over answers the policy's KL to the reference with far less noise
than the sampled estimate (the sum of log p_policy - log p_reference over the answer's tokens,
which a policy that barely moved can put below 0; kept beside it, named as such).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from rlhf.eval.answers import ScoredAnswers
from rlhf.eval.gold import gold_summary, has_judge
from rlhf.eval.win_rates import compare
from rlhf.models.backbone import Backbone
from rlhf.reward_sources import GOLD
from rlhf.sampling.forward import response_kl
from rlhf.sampling.rollout import sample_rollout
from rlhf.sampling.sampler import SamplingConfig
from rlhf.tokenizer.tokenizer import Tokenizer

if TYPE_CHECKING:
    from rlhf.algorithms.scorers import Scorer

# the RL stage's gold scores: None on prompts from outside the task suite
GOLD_VS_REFERENCE = (
    "gold_sampled",
    "gold_sampled_sft",
    "gold_sampled_by_task",
    "gold_sampled_sft_by_task",
)
REPORT_RESAMPLES = 1000  # bootstrap resamples of the RL stage's win-rate intervals


@dataclass
class PolicySamples:
    prompts: list[str]  # each evaluation prompt `n` times, in order
    responses: list[str]
    kl_to_reference: list[float]  # per answer, exact over the vocabulary; empty without one
    kl_sampled: list[float] = field(default_factory=list)  # the sampled log-ratio estimate
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
            kl = response_kl(
                policy,
                reference,
                rollout.sequences,
                rollout.attention_mask,
                rollout.prompt_width,
                config.temperature,
            )
            mask = rollout.response_mask
            samples.kl_to_reference += torch.where(mask, kl.exact, 0.0).sum(-1).tolist()
            log_ratio = rollout.logprobs - kl.reference_logprobs
            samples.kl_sampled += torch.where(mask, log_ratio, 0.0).sum(-1).tolist()
    return samples


Judge = Callable[[str, str], float]


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
    other_judges: Mapping[str, Scorer] | None = None,
) -> ScoredAnswers:
    """Sample `n` answers per prompt and measure each: gold, reward, KL, length, ending, and
    the score of every judge: `gold` where there is a gold judge, `rm` (the reward), and
    `other_judges` by name.

    The reference sampled as it is (temperature 1) gets a KL of exactly 0 without a second
    forward pass.
    """
    itself = policy is reference and config.temperature == 1.0
    samples = sample_policy(
        policy, tokenizer, prompts, n=n, config=config, seed=seed, batch_size=batch_size,
        reference=None if itself else reference,
    )  # fmt: skip
    responses = samples.responses
    pairs = zip(samples.prompts, responses, strict=True)
    return ScoredAnswers(
        prompt_index=[i for i in range(len(prompts)) for _ in range(n)],
        prompts=samples.prompts,
        tasks=[t for t in tasks for _ in range(n)],
        responses=responses,
        gold=None if judge is None else [judge(p, r) for p, r in pairs],
        reward=scorer(samples.prompts, responses).tolist(),
        kl=samples.kl_to_reference or [0.0] * len(responses),
        kl_sampled=samples.kl_sampled or [0.0] * len(responses),
        length=samples.lengths,
        ended=samples.ended,
        other_judges={
            name: other(samples.prompts, responses).tolist()
            for name, other in (other_judges or {}).items()
        },
    )


def versus_reference(
    policy: Backbone,
    reference: Backbone,
    tokenizer: Tokenizer,
    heldout: Sequence[dict[str, Any]],
    *,
    reward: tuple[str, Scorer],
    samples: int,
    max_new_tokens: int,
    seed: int,
    batch_size: int,
) -> dict[str, Any]:
    """The policy against the reference on held-out prompts, `samples` answers per prompt at
    temperature 1, both sampled with the same seed: its KL to the reference, and its win rate
    over the reference (ties half, with a 95% bootstrap interval over prompts) by each judge
    that applies: the RL reward source `reward` (name, scorer), the proxy the policy was
    trained on, and the gold judge where the prompts come from the task suite, which also
    gives both policies' gold scores. Without a gold judge those keys stay, as None, so every
    run's metrics have the same keys."""
    config = SamplingConfig(max_new_tokens=max_new_tokens)
    prompts = [r["prompt"] for r in heldout]
    common: dict[str, Any] = dict(n=samples, config=config, seed=seed, batch_size=batch_size)
    mine = sample_policy(policy, tokenizer, prompts, reference=reference, **common)
    theirs = sample_policy(reference, tokenizer, prompts, **common)
    name, scorer = reward
    judged = {name: [scorer(s.prompts, s.responses).tolist() for s in (mine, theirs)]}
    gold: dict[str, Any] = dict.fromkeys(GOLD_VS_REFERENCE)
    if has_judge(heldout):
        tasks = [r["task"] for r in heldout for _ in range(samples)]
        mine_gold, theirs_gold = (
            gold_summary(s.prompts, tasks, s.responses) for s in (mine, theirs)
        )
        judged = {GOLD: [mine_gold["scores"], theirs_gold["scores"]]} | judged
        gold = {
            "gold_sampled": mine_gold["mean"],
            "gold_sampled_sft": theirs_gold["mean"],
            "gold_sampled_by_task": mine_gold["by_task"],
            "gold_sampled_sft_by_task": theirs_gold["by_task"],
        }
    groups = [i for i in range(len(prompts)) for _ in range(samples)]
    rates = {
        judge: compare(a, b, groups, resamples=REPORT_RESAMPLES, seed=seed)
        for judge, (a, b) in judged.items()
    }
    kl = mine.kl_to_reference
    return gold | {
        "win_rate_vs_sft": {judge: round(r.rate, 4) for judge, r in rates.items()},
        "win_rate_vs_sft_ci95": {
            judge: {"low": round(r.low, 4), "high": round(r.high, 4)} for judge, r in rates.items()
        },
        "kl_to_sft": round(sum(kl) / len(kl), 4),
    }
