"""One RL iteration at a time, for any registered algorithm: rollout, scoring, advantages,
updates.

The policy and the frozen reference both start as the SFT model; a critic, where the algorithm
has one, starts as the reward model (InstructGPT) or is a value head on the policy trunk.
Algorithms that penalize KL in the reward put it on every token's reward, so it reaches the
policy through the advantages of the very tokens that drifted; GRPO adds it to the loss.
Dropout stays off throughout (every model in eval mode): it would make the ratios between the
rollout policy and the updated one noise.

Everything a resumed run needs (models, optimizers, KL coefficient, step, every RNG) comes out
of `state_dict()`, so an interrupted run picks up exactly where it stopped.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlhf.algorithms.rl.advantages import token_rewards
from rlhf.algorithms.rl.kl import KLController, kl_per_token
from rlhf.algorithms.rl.losses import (
    clipped_value_loss,
    entropy,
    explained_variance,
    masked_mean,
)
from rlhf.algorithms.rl.microbatches import cut, microbatches
from rlhf.algorithms.rl.registry import Algorithm
from rlhf.algorithms.rl.shards import whole_batch
from rlhf.algorithms.scorers import Scorer
from rlhf.algorithms.sft import masked_lm_loss
from rlhf.data.batching import collate
from rlhf.data.chat import Example
from rlhf.data.tokenizer import Tokenizer
from rlhf.models.backbone import Backbone
from rlhf.models.lora import adapters_off
from rlhf.params import ClipParams, CriticParams, PolicyOptimParams, RLParams
from rlhf.sampling.forward import response_forward, response_values
from rlhf.sampling.rollout import Rollout, sample_rollout
from rlhf.sampling.sampler import SamplingConfig
from rlhf.sampling.streams import SEED_LIMIT, RowStreams
from rlhf.train.device import autocast, rng_state, set_rng_state
from rlhf.train.distributed import World, globally_normalized, max_across, sum_across
from rlhf.train.guard import Terms, grad_norm, require_finite
from rlhf.train.loop import batch_order, read_together
from rlhf.train.optim import adamw, lr_at, set_lr
from rlhf.train.sharding import Holder, hold


@dataclass
class Experience:
    rollout: Rollout
    old_logprobs: Tensor  # [B, N] policy log-probs at rollout time (full forward)
    ref_logprobs: Tensor  # [B, N] reference log-probs
    scores: Tensor  # [B] the reward source's score
    advantages: Tensor  # [B, N]
    values: Tensor | None  # [B, N] critic values at rollout time; None without a critic
    returns: Tensor | None  # [B, N] what the critic regresses on


# (name, weight, value): what a minibatch recorded, values still on the device until read
Recorded = list[tuple[str, float, float | Tensor]]


def added_up(recorded: Recorded) -> dict[str, float | Tensor]:
    """Each statistic's weighted values added up, in the order recorded."""
    totals: dict[str, float | Tensor] = {}
    for key, weight, value in recorded:
        totals[key] = totals.get(key, 0.0) + weight * value
    return totals


# record(weight, name=value, ...): this rank's minibatch statistics, each a mean over its
# rows, with `weight` the rows' share of the minibatch's units (1 in one process)
Recorder = Callable[..., None]


def prompt_schedule(n_prompts: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Prompt indices of iteration `step`: consecutive slices of per-epoch shuffles."""
    first, last = step * batch_size, (step + 1) * batch_size
    orders = {
        e: batch_order(n_prompts, seed, e)
        for e in range(first // n_prompts, (last - 1) // n_prompts + 1)
    }
    return [orders[p // n_prompts][p % n_prompts] for p in range(first, last)]


MISMATCH_KEYS = ("logprob_mismatch", "logprob_mismatch_max")  # the statistics' names


def logprob_mismatch(sampled: Tensor, scored: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the sampler's log-probs [B, N] are from the scoring pass's [B, N] over the
    response tokens (mask [B, N]): the mean and the largest |difference|. The ratios of the
    clipped losses take the scoring pass's as the rollout policy's, so the two must agree;
    engines that sample with other kernels than they train with (vLLM) correct for the gap by
    importance sampling, where ours shows it is float rounding."""
    gap = (sampled - scored).abs()[mask]
    return dict(zip(MISMATCH_KEYS, (float(gap.mean()), float(gap.max())), strict=True))


class RLTrainer:
    def __init__(
        self,
        algorithm: Algorithm,
        cfg: PolicyOptimParams,
        shared: RLParams,
        *,
        policy: Backbone,
        reference: Backbone | None,
        critic: Backbone | None,
        scorer: Scorer,
        tokenizer: Tokenizer,
        prompts: Sequence[str],
        seed: int,
        ptx_examples: Sequence[Example] = (),
        world: World = World(),  # noqa: B008 (frozen)
        strategy: str = "ddp",
    ):
        """reference: the frozen SFT policy; None for an adapted policy (`add_adapters`),
        whose reference is itself with its adapters off. critic: the separate critic
        (`critic: separate`); None for a value head on the policy (`critic: shared`) or an
        algorithm without a critic. Under torchrun (`world`) each rank samples and scores
        its share of every iteration's rows and trains on its share of every minibatch, the
        policy and critic replicated (`strategy` ddp) or sharded across the ranks (fsdp2;
        the frozen reference stays whole on each, in bfloat16 under `memory.frozen_bf16`)."""
        self.algorithm, self.cfg, self.shared = algorithm, cfg, shared
        self.policy, self.reference, self.critic = policy, reference, critic
        self.scorer, self.tokenizer = scorer, tokenizer
        self.prompts, self.seed = list(prompts), seed
        self.ptx_examples, self.world = list(ptx_examples), world
        self.shared_critic = isinstance(cfg, CriticParams) and cfg.critic == "shared"
        if isinstance(cfg, CriticParams) and cfg.critic == "separate" and critic is None:
            raise ValueError(f"{algorithm.name} with critic: separate needs a critic model")
        self.device = next(policy.parameters()).device
        # how each rank holds the trained models: one gradient reduction per minibatch and
        # model; the optimizers take the parameters as held (sharded under fsdp2)
        self.held_policy = hold(policy, strategy, world, self.device, cfg.bf16)
        self.held_critic = None
        if critic is not None:
            self.held_critic = hold(critic, strategy, world, self.device, cfg.bf16)
        betas = (cfg.beta1, cfg.beta2)
        self.policy_opt = adamw(policy, cfg.lr, cfg.weight_decay, betas)
        self.critic_opt = None
        if critic is not None:
            assert isinstance(cfg, CriticParams)
            self.critic_opt = adamw(critic, cfg.critic_lr, cfg.weight_decay, betas)
        self.kl_ctl = KLController(cfg.kl_coef, cfg.kl_target or None, cfg.kl_horizon)
        self.sampling = SamplingConfig(
            max_new_tokens=shared.max_new_tokens,
            temperature=shared.temperature,
            top_k=shared.top_k,
            top_p=shared.top_p,
        )
        self.sample_rng = torch.Generator().manual_seed(seed)  # each row's sampling seed
        self.shuffle_rng = torch.Generator().manual_seed(seed + 1)
        self.ptx_rng = random.Random(seed + 2)
        self.step = 0
        for model in (policy, reference, critic):
            if model is not None:
                model.eval()  # dropout off everywhere: it would make the ratios noise
        if reference is not None:
            reference.requires_grad_(False)

    # -- experience ------------------------------------------------------------------------
    @torch.no_grad()
    def make_experience(self, prompts: Sequence[str]) -> tuple[Experience, dict[str, float]]:
        """Sample `group_size` answers to each prompt, score them, estimate advantages.

        Every answer is sampled from its own seeded stream, so a rank sampling a share of
        them draws what one process draws for them; the shares are scored where they were
        sampled and gathered, and the rest is computed on the whole batch by every rank."""
        cfg, shared, world = self.cfg, self.shared, self.world
        answered = [p for p in prompts for _ in range(cfg.group_size)]  # a prompt per answer
        seeds = torch.randint(SEED_LIMIT, (len(answered),), generator=self.sample_rng).tolist()
        mine, holds_rows = world.shard(list(range(len(answered))))
        started = time.perf_counter()
        with autocast(self.device, cfg.bf16):  # the precision the scoring pass runs in
            share = self.held_policy.gathered(
                lambda: sample_rollout(
                    self.policy,
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
        rewards = rewards.clamp(-shared.reward_clip, shared.reward_clip)
        beta = self.kl_ctl.beta if self.algorithm.kl_penalty == "reward" else 0.0
        kl = kl_per_token(policy_logprobs, ref_logprobs)  # k1, as the penalty always was
        penalty = torch.where(mask, -beta * kl, 0.0)  # [B, N]
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
            "beta": self.kl_ctl.beta,
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
            self._score_rows(rollout, torch.tensor(rows, device=self.device))
            for rows in groups + [groups[0][:1]] * (count - len(groups))
        ][: len(groups)]
        scored = {key: torch.cat([f[key] for f in forwards]) for key in forwards[0]}
        scored["scores"] = self.scorer(rollout.prompts, rollout.responses).to(self.device)
        return scored

    def _score_rows(self, rollout: Rollout, rows: Tensor) -> dict[str, Tensor]:
        """`_score`'s model forwards for some `rows` of the rollout."""
        args = (rollout.sequences[rows], rollout.attention_mask[rows], rollout.prompt_width)

        def policy_side() -> dict[str, Tensor]:
            out = response_forward(self.policy, *args, self.shared.temperature)
            scored = {"policy_logprobs": out.logprobs}
            if self.shared_critic:
                scored["values"] = self.policy.values(out.hidden).float()
            if self.reference is None:  # the adapted policy, its adapters off
                with adapters_off(self.policy):
                    reference = response_forward(self.policy, *args, self.shared.temperature)
                scored["ref_logprobs"] = reference.logprobs
            return scored

        with autocast(self.device, self.cfg.bf16):
            scored = self.held_policy.evaluate(policy_side)
            if self.reference is not None:
                reference = response_forward(self.reference, *args, self.shared.temperature)
                scored["ref_logprobs"] = reference.logprobs
            if self.held_critic is not None:
                critic = self.held_critic
                scored["values"] = critic.evaluate(lambda: response_values(critic.model, *args))
        return scored

    # -- update ----------------------------------------------------------------------------
    def _ptx_loss(self, record: Recorder) -> Tensor:
        """This rank's part of the pretraining-mix LM loss on demonstrations drawn alike on
        every rank: the token mean over its share, weighted by the share's tokens."""
        batch = self.ptx_rng.sample(
            self.ptx_examples, min(self.cfg.ptx_batch_size, len(self.ptx_examples))
        )
        rows, weight = self.world.weighed_shard(
            list(range(len(batch))), lambda some: sum(batch[i].target_count for i in some)
        )
        inputs, targets = collate([batch[i] for i in rows], self.tokenizer.pad_id)
        ptx = masked_lm_loss(self.policy, inputs.to(self.device), targets.to(self.device))
        record(weight, ptx_loss=ptx)
        return globally_normalized(ptx, weight, self.world)

    def _critic_loss(
        self, exp: Experience, rows: Tensor, weight: float, record: Recorder
    ) -> Tensor:
        """This rank's part of the critic's clipped value loss on some rows of the rollout
        (weighted as `_minibatch_loss` is)."""
        assert isinstance(self.cfg, CriticParams) and self.critic is not None
        assert exp.values is not None and exp.returns is not None
        part = exp.rollout
        values = response_values(
            self.critic, part.sequences[rows], part.attention_mask[rows], part.prompt_width
        )
        loss, clip_fraction = clipped_value_loss(
            values,
            exp.values[rows],
            exp.returns[rows],
            part.response_mask[rows],
            self.cfg.cliprange_value,
        )
        record(weight, value_loss=loss, value_clip_fraction=clip_fraction)
        return globally_normalized(loss, weight, self.world)

    def _minibatch_loss(
        self, exp: Experience, rows: Tensor, weight: float, record: Recorder, with_ptx: bool
    ) -> Tensor:
        """This rank's part of the policy's loss on a minibatch, under autocast: the mean over
        `rows`' response tokens times `weight`, their share of the minibatch's tokens, and
        the number of ranks, so that the parts added up over microbatches and averaged over
        ranks (DDP, FSDP2) are the minibatch's loss; `with_ptx`: the pretraining mix, which
        one microbatch of each minibatch adds."""
        cfg, rollout = self.cfg, exp.rollout
        mask = rollout.response_mask[rows]
        out = response_forward(
            self.policy,
            rollout.sequences[rows],
            rollout.attention_mask[rows],
            rollout.prompt_width,
            self.shared.temperature,
        )
        policy = self.algorithm.policy_loss(
            out.logprobs, exp.old_logprobs[rows], exp.advantages[rows], mask, cfg
        )
        # at weight 0 the entropy is only logged: no backward pass through it
        with torch.set_grad_enabled(cfg.entropy_coef > 0):
            mean_entropy = masked_mean(entropy(out.logits), mask)
        loss = policy.loss - cfg.entropy_coef * mean_entropy
        if self.algorithm.kl_penalty == "loss":
            kl = masked_mean(kl_per_token(out.logprobs, exp.ref_logprobs[rows], "k3"), mask)
            loss = loss + self.kl_ctl.beta * kl
            record(weight, kl_loss=kl)
        if self.shared_critic:
            assert isinstance(cfg, CriticParams)
            assert exp.values is not None and exp.returns is not None
            value_loss, value_clip = clipped_value_loss(
                self.policy.values(out.hidden).float(),
                exp.values[rows],
                exp.returns[rows],
                mask,
                cfg.cliprange_value,
            )
            loss = loss + cfg.vf_coef * value_loss
            record(weight, value_loss=value_loss, value_clip_fraction=value_clip)
        loss = globally_normalized(loss, weight, self.world)
        if with_ptx and cfg.ptx_coef > 0 and self.ptx_examples:
            loss = loss + cfg.ptx_coef * self._ptx_loss(record)
        record(
            weight,
            policy_loss=policy.loss,
            clip_fraction=policy.clip_fraction,
            approx_kl=policy.approx_kl,
            entropy=mean_entropy,
        )
        return loss

    def _accumulated_step(
        self,
        held: Holder,
        optimizer: torch.optim.Optimizer,
        parts: list[tuple[Tensor, float]],
        loss_of: Callable[[Tensor, float, bool], Tensor],
        names: tuple[str, str],
        terms: Callable[[], Terms],
    ) -> None:
        """One optimizer step on the gradients of every part (rows, share) added up:
        `loss_of(rows, share, last)` forward under autocast and backward, part by part, the
        gradients reduced across ranks with the last. Unless the loss summed over the parts
        or the gradient norm (`names` name them) is not finite: every rank checks the same
        reduced values, so all stop or none, before the update."""
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for index, (rows, share) in enumerate(parts):
            last = index == len(parts) - 1
            with held.accumulating(last):
                with autocast(self.device, self.cfg.bf16):
                    loss = held.loss(loss_of, rows, share, last)
                loss.backward()
            total = total + loss.detach()
        norm = grad_norm(held.model.parameters(), self.cfg.grad_clip)
        loss, norm = read_together(total, norm)  # the step's one wait on the device
        loss_name, norm_name = names
        require_finite(self.step + 1, {loss_name: self._global(loss)}, terms)
        require_finite(self.step + 1, {norm_name: norm})
        optimizer.step()

    def _global(self, loss: float) -> float:
        """The minibatch's loss over every rank, from this rank's weighted part: what the
        finiteness check looks at, so that a NaN on one rank stops them all at once."""
        return sum_across(self.world, [loss], self.device)[0] / self.world.size

    def _summed(self, weighed: list[Recorded]) -> list[dict[str, float]]:
        """Minibatches' statistics over every rank: the sums of the ranks' weighted means,
        every value of the pass read from the device at once."""
        values = iter(read_together(*(value for stats in weighed for _, _, value in stats)))
        means = [added_up([(key, w, next(values)) for key, w, _ in stats]) for stats in weighed]
        summed = iter(sum_across(self.world, [v for m in means for v in m.values()], self.device))
        return [{key: next(summed) for key in m} for m in means]

    def update(self, exp: Experience) -> dict[str, float]:
        """Passes over the rollout in shuffled minibatches: several for a clipped ratio (until
        approx-KL passes `target_approx_kl`), one for a plain policy gradient. A non-finite
        loss or gradient norm stops it before that update, naming the terms that were.
        Each rank trains on its share of every minibatch; the statistics are the whole
        minibatch's, reduced once per pass."""
        cfg, world = self.cfg, self.world
        inputs = {"scores": exp.scores.sum(), "advantages": exp.advantages.sum()}
        started = time.perf_counter()
        totals: dict[str, list[float]] = {}  # each minibatch's statistics, over every rank
        current: Recorded = []  # this minibatch's statistics, as recorded

        def record(weight: float, **values: float | Tensor) -> None:
            current.extend(
                (key, weight, value.detach() if isinstance(value, Tensor) else value)
                for key, value in values.items()
            )

        clipped = isinstance(cfg, ClipParams)
        passes = cfg.update_epochs if clipped else 1
        rollout, batch = exp.rollout, exp.rollout.sequences.shape[0]
        lengths = rollout.attention_mask.sum(-1).tolist()  # the tokens each row forwards
        answered = rollout.response_mask.sum(-1).tolist()  # the tokens each row's loss counts
        starts = range(0, batch, cfg.minibatch_size)
        trained_tokens = 0
        epochs_run = 0
        for _ in range(passes):
            order = torch.randperm(batch, generator=self.shuffle_rng).tolist()
            weighed: list[Recorded] = []  # this rank's statistics, per minibatch
            for start in starts:
                minibatch = order[start : start + cfg.minibatch_size]
                tokens = sum(answered[row] for row in minibatch)  # what the loss averages
                parts = [
                    (
                        torch.tensor(part.rows, device=self.device),
                        sum(answered[row] for row in part.rows) / tokens if part.counts else 0.0,
                    )
                    for part in microbatches(
                        world, minibatch, lengths, self.shared.microbatch_tokens
                    )
                ]
                current.clear()
                self._accumulated_step(
                    self.held_policy,
                    self.policy_opt,
                    parts,
                    lambda rows, share, last: self._minibatch_loss(exp, rows, share, record, last),
                    ("loss", "policy_grad_norm"),
                    lambda: added_up(current) | inputs,
                )
                if self.held_critic is not None and self.critic_opt is not None:
                    self._accumulated_step(
                        self.held_critic,
                        self.critic_opt,
                        parts,
                        lambda rows, share, _: self._critic_loss(exp, rows, share, record),
                        ("value_loss", "critic_grad_norm"),
                        dict,
                    )
                weighed.append(list(current))
                trained_tokens += sum(lengths[row] for row in minibatch)
            for stats in self._summed(weighed):
                for key, value in stats.items():
                    totals.setdefault(key, []).append(value)
            epochs_run += 1
            pass_kl = sum(totals["approx_kl"][-len(starts) :]) / len(starts)
            if clipped and cfg.target_approx_kl and pass_kl > cfg.target_approx_kl:
                break
        update_s = time.perf_counter() - started
        return {
            **{key: sum(v) / len(v) for key, v in totals.items()},
            "update_epochs_run": epochs_run,
            "update_tokens_per_s": trained_tokens / update_s,
            "update_s": update_s,
        }

    # -- one iteration ---------------------------------------------------------------------
    def iteration(self) -> tuple[dict[str, float], Experience]:
        """Rollout on this step's prompts, score, update; then adapt beta to the KL measured."""
        cfg = self.cfg
        lr = lr_at(self.step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
        set_lr(self.policy_opt, lr)
        if self.critic_opt is not None:
            assert isinstance(cfg, CriticParams)
            set_lr(
                self.critic_opt,
                lr_at(self.step, cfg.critic_lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio),
            )
        rows = prompt_schedule(len(self.prompts), cfg.batch_size, self.seed, self.step)
        experience, stats = self.make_experience([self.prompts[i] for i in rows])
        stats |= self.update(experience)
        self.kl_ctl.update(stats["kl"], len(experience.rollout.prompts))
        self.step += 1
        stats["step"] = self.step
        stats["lr"] = lr
        return stats, experience

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs, the models and optimizers whole (every rank must
        call it: under fsdp2 it gathers them, onto rank 0)."""
        policy, policy_opt = self.held_policy.state(self.policy_opt)
        state: dict[str, Any] = {
            "step": self.step,
            "policy": policy,
            "policy_opt": policy_opt,
            "kl_ctl": self.kl_ctl.state(),
            "rng": rng_state(),
            "sample_rng": self.sample_rng.get_state(),
            "shuffle_rng": self.shuffle_rng.get_state(),
            "ptx_rng": list(self.ptx_rng.getstate()[1]),
        }
        if self.held_critic is not None and self.critic_opt is not None:
            state["critic"], state["critic_opt"] = self.held_critic.state(self.critic_opt)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.held_policy.load(self.policy_opt, state["policy"], state["policy_opt"])
        self.kl_ctl.load(state["kl_ctl"])
        set_rng_state(state["rng"])
        self.sample_rng.set_state(state["sample_rng"])
        self.shuffle_rng.set_state(state["shuffle_rng"])
        version, _, gauss = self.ptx_rng.getstate()
        self.ptx_rng.setstate((version, tuple(int(x) for x in state["ptx_rng"]), gauss))
        if self.held_critic is not None and self.critic_opt is not None:
            self.held_critic.load(self.critic_opt, state["critic"], state["critic_opt"])

    def whole_policy(self) -> Backbone:
        """The policy, whole (every rank must call it: under fsdp2 it gathers a copy)."""
        return self.held_policy.whole_model()
