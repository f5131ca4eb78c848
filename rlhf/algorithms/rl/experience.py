"""Making experience for one RL iteration: sample answers, score them with every model,
estimate advantages.

Every answer is sampled from its own seeded stream, so a rank sampling a share of them draws
what one process draws for them; the shares are scored where they were sampled and gathered,
and the rest is computed on the whole batch by every rank. Algorithms that penalize KL in the
reward put it on every token's reward here, so it reaches the policy through the advantages of
the very tokens that drifted. The update that learns from it is `trainer.py`'s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf.algorithms.rl.advantages import overlong_penalty, token_rewards
from rlhf.algorithms.rl.kl import kl_per_token
from rlhf.algorithms.rl.losses import explained_variance
from rlhf.algorithms.rl.microbatches import Forwarded, cut, forwarded
from rlhf.algorithms.rl.registry import Algorithm
from rlhf.algorithms.rl.shards import whole_batch
from rlhf.algorithms.scorers import Scorer
from rlhf.models.backbone import Backbone
from rlhf.models.lora import adapters_off
from rlhf.models.precision import SamplingCopy, wants_sampling_copy
from rlhf.params.groups import PolicyOptimParams, RLParams
from rlhf.sampling.forward import response_forward, response_values
from rlhf.sampling.rollout import Rollout, sample_rollout
from rlhf.sampling.sampler import SamplingConfig
from rlhf.sampling.streams import SEED_LIMIT, RowStreams
from rlhf.tokenizer.tokenizer import Tokenizer
from rlhf.train.device import autocast
from rlhf.train.distributed import World, max_across
from rlhf.train.sharding import Holder, Replicas


@dataclass
class Experience:
    rollout: Rollout
    old_logprobs: Tensor  # [B, N] policy log-probs at rollout time (full forward)
    ref_logprobs: Tensor  # [B, N] reference log-probs
    scores: Tensor  # [B] the reward source's score
    advantages: Tensor  # [B, N]
    values: Tensor | None  # [B, N] critic values at rollout time; None without a critic
    returns: Tensor | None  # [B, N] what the critic regresses on


MISMATCH_KEYS = ("logprob_mismatch", "logprob_mismatch_max")  # the statistics' names


def logprob_mismatch(sampled: Tensor, scored: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the sampler's log-probs [B, N] are from the scoring pass's [B, N] over the
    response tokens (mask [B, N]): the mean and the largest |difference|. The ratios of the
    clipped losses take the scoring pass's as the rollout policy's, so the two must agree;
    engines that sample with other kernels than they train with (vLLM) correct for the gap by
    importance sampling, where ours shows it is float rounding."""
    gap = (sampled - scored).abs()[mask]
    return dict(zip(MISMATCH_KEYS, (float(gap.mean()), float(gap.max())), strict=True))


class ExperienceMaker:
    """The models' side of an iteration before the update: the policy as the trainer holds it
    (`held_policy`, gathered to sample under fsdp2), the frozen reference (None: the adapted
    policy with its adapters off), the critic where there is one (`held_critic`, or values
    from the policy's head with `shared_critic`), the reward source and each row's sampling
    seed (`sample_rng`, part of the trainer's resume state)."""

    def __init__(
        self,
        algorithm: Algorithm,
        cfg: PolicyOptimParams,
        shared: RLParams,
        *,
        held_policy: Holder,
        reference: Backbone | None,
        held_critic: Holder | None,
        shared_critic: bool,
        scorer: Scorer,
        tokenizer: Tokenizer,
        seed: int,
        world: World,
    ):
        self.algorithm, self.cfg, self.shared = algorithm, cfg, shared
        self.held_policy, self.policy = held_policy, held_policy.model
        self.reference, self.held_critic, self.shared_critic = reference, held_critic, shared_critic
        self.scorer, self.tokenizer, self.world = scorer, tokenizer, world
        self.device = next(self.policy.parameters()).device
        self.sampling = SamplingConfig(
            max_new_tokens=shared.max_new_tokens,
            temperature=shared.temperature,
            top_k=shared.top_k,
            top_p=shared.top_p,
        )
        self.sample_rng = torch.Generator().manual_seed(seed)  # each row's sampling seed
        # a float32 policy sampled under bf16 autocast on CUDA samples through a bf16 copy
        # (`rlhf.models.precision`); sharded, it is gathered for sampling instead
        copied = wants_sampling_copy(self.policy, self.device, cfg.bf16)
        unsharded = isinstance(held_policy, Replicas)
        self.sampling_copy = SamplingCopy(self.policy) if copied and unsharded else None

    @torch.no_grad()
    def make(self, prompts: Sequence[str], beta: float) -> tuple[Experience, dict[str, float]]:
        """Sample `group_size` answers to each prompt, score them, estimate advantages, with
        the KL coefficient `beta` where the algorithm puts the penalty in the reward."""
        cfg, shared, world = self.cfg, self.shared, self.world
        answered = [p for p in prompts for _ in range(cfg.group_size)]  # a prompt per answer
        seeds = torch.randint(SEED_LIMIT, (len(answered),), generator=self.sample_rng).tolist()
        mine, holds_rows = world.shard(list(range(len(answered))))
        started = time.perf_counter()
        sampler = self.policy if self.sampling_copy is None else self.sampling_copy.refresh()
        with autocast(self.device, cfg.bf16):  # the precision the scoring pass runs in
            share = self.held_policy.gathered(
                lambda: sample_rollout(
                    sampler,
                    self.tokenizer,
                    [answered[i] for i in mine],
                    self.sampling,
                    RowStreams([seeds[i] for i in mine]),
                )
            )
        rollout_s = time.perf_counter() - started

        started = time.perf_counter()
        rollout, scored = whole_batch(
            world, answered, share, self._score(share), holds_rows, self.tokenizer
        )
        policy_logprobs, ref_logprobs = scored["policy_logprobs"], scored["ref_logprobs"]
        values, scores = scored.get("values"), scored["scores"]
        mask = rollout.response_mask
        rewards = scores - shared.missing_eos_penalty * (~rollout.ended).float()
        rewards = rewards - shared.length_penalty * rollout.lengths.float()
        if shared.overlong_buffer:
            rewards = rewards - overlong_penalty(
                rollout.lengths, shared.max_new_tokens, shared.overlong_buffer,
                shared.overlong_penalty,
            )  # fmt: skip
        rewards = rewards.clamp(-shared.reward_clip, shared.reward_clip)
        in_reward = beta if self.algorithm.kl_penalty == "reward" else 0.0
        kl = kl_per_token(policy_logprobs, ref_logprobs)  # k1, as the penalty always was
        penalty = torch.where(mask, -in_reward * kl, 0.0)  # [B, N]
        per_token = token_rewards(rewards, penalty, mask)
        if values is not None:
            values = torch.where(mask, values, 0.0)
        advantages, returns = self.algorithm.advantages(per_token, values, mask, cfg)
        scoring_s = time.perf_counter() - started

        experience = Experience(
            rollout=rollout,
            old_logprobs=policy_logprobs,
            ref_logprobs=ref_logprobs,
            scores=scores,
            advantages=advantages,
            values=values,
            returns=returns,
        )
        logged_kl = kl_per_token(policy_logprobs, ref_logprobs, shared.kl_estimator)
        generated = float(mask.sum())
        stats = {
            "score": float(scores.mean()),
            "reward": float(rewards.mean()),
            "non_score_reward": float(penalty.sum(-1).mean()),
            "kl": float(torch.where(mask, logged_kl, 0.0).sum(-1).mean()),
            "beta": beta,
            "response_length": float(rollout.lengths.float().mean()),
            "end_token_rate": float(rollout.ended.float().mean()),
        }
        if values is not None and returns is not None:
            stats["explained_variance"] = explained_variance(values, returns, mask)
        stats |= logprob_mismatch(rollout.logprobs, policy_logprobs, mask)
        stats |= {
            "rollout_tokens_per_s": generated / rollout_s,
            "rollout_s": rollout_s,
            "scoring_s": scoring_s,
        }
        return experience, stats

    def _score(self, rollout: Rollout) -> dict[str, Tensor]:
        """What the models say of each row: policy and reference log-probs [B, N], the
        critic's values [B, N] where there is a critic, the reward source's scores [B]. The
        forwards run in microbatches of at most `rl.microbatch_tokens` tokens, as many on
        every rank (the spare ones on a stand-in row, their results dropped)."""
        lengths = rollout.attention_mask.sum(-1).tolist()
        groups = cut(range(len(lengths)), lengths, self.shared.microbatch_tokens)
        count = max_across(self.world, len(groups), self.device)
        forwards = [
            self._score_rows(rollout, forwarded(rollout, rows, lengths, self.policy))
            for rows in groups + [groups[0][:1]] * (count - len(groups))
        ][: len(groups)]
        scored = {key: torch.cat([f[key] for f in forwards]) for key in forwards[0]}
        scored["scores"] = self.scorer(rollout.prompts, rollout.responses).to(self.device)
        return scored

    def _score_rows(self, rollout: Rollout, part: Forwarded) -> dict[str, Tensor]:
        """`_score`'s model forwards for some rows of the rollout, on one packing."""
        args = (part.ids, part.real, rollout.prompt_width)
        temperature, packing = self.shared.temperature, part.packing

        def policy_side() -> dict[str, Tensor]:
            out = response_forward(self.policy, *args, temperature, packing)
            scored = {"policy_logprobs": out.logprobs}
            if self.shared_critic:
                scored["values"] = self.policy.values(out.hidden).float()
            if self.reference is None:  # the adapted policy, its adapters off
                with adapters_off(self.policy):
                    reference = response_forward(self.policy, *args, temperature, packing)
                scored["ref_logprobs"] = reference.logprobs
            return scored

        with autocast(self.device, self.cfg.bf16):
            scored = self.held_policy.evaluate(policy_side)
            if self.reference is not None:
                reference = response_forward(self.reference, *args, temperature, packing)
                scored["ref_logprobs"] = reference.logprobs
            if self.held_critic is not None:
                critic = self.held_critic
                scored["values"] = critic.evaluate(
                    lambda: response_values(critic.model, *args, packing)
                )
        return scored
