"""One RL iteration at a time, for any registered algorithm: experience (rollout, scoring,
advantages: `experience.py`), then the updates, and the state a resumed run needs.

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
from typing import Any

import torch
from torch import Tensor

from rlhf.algorithms.rl.dynamic_sampling import informative_batch
from rlhf.algorithms.rl.experience import Experience, ExperienceMaker
from rlhf.algorithms.rl.kl import KLController, kl_per_token
from rlhf.algorithms.rl.losses import aggregate, clipped_value_loss, token_weights
from rlhf.algorithms.rl.microbatches import Forwarded, forwarded, microbatches
from rlhf.algorithms.rl.registry import Algorithm
from rlhf.algorithms.scorers import Scorer
from rlhf.algorithms.sft import masked_lm_loss
from rlhf.data.batching import collate
from rlhf.models.backbone import Backbone
from rlhf.params.groups import ClipParams, CriticParams, GRPOParams, PolicyOptimParams, RLParams
from rlhf.sampling.forward import response_forward, response_values
from rlhf.tokenizer.chat import Example
from rlhf.tokenizer.tokenizer import Tokenizer
from rlhf.train.batches import batch_order, read_together
from rlhf.train.device import autocast, rng_state, set_rng_state
from rlhf.train.distributed import World, globally_normalized, sum_across
from rlhf.train.guard import Terms, grad_norm, require_finite
from rlhf.train.optim import adamw, lr_at, set_lr
from rlhf.train.sharding import Holder, hold

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
        self.tokenizer = tokenizer
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
        self.experience = ExperienceMaker(
            algorithm, cfg, shared,
            held_policy=self.held_policy, reference=reference, held_critic=self.held_critic,
            shared_critic=self.shared_critic, scorer=scorer, tokenizer=tokenizer, seed=seed,
            world=world,
        )  # fmt: skip
        self.shuffle_rng = torch.Generator().manual_seed(seed + 1)
        self.ptx_rng = random.Random(seed + 2)
        self.step = 0
        for model in (policy, reference, critic):
            if model is not None:
                model.eval()  # dropout off everywhere: it would make the ratios noise
        if reference is not None:
            reference.requires_grad_(False)

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
        self, exp: Experience, part: Forwarded, weight: float, record: Recorder
    ) -> Tensor:
        """This rank's part of the critic's clipped value loss on some rows of the rollout
        (weighted as `_minibatch_loss` is)."""
        assert isinstance(self.cfg, CriticParams) and self.critic is not None
        assert exp.values is not None and exp.returns is not None
        rollout, rows = exp.rollout, part.rows
        values = response_values(
            self.critic, part.ids, part.real, rollout.prompt_width, part.packing
        )
        mask = rollout.response_mask[rows]
        loss, clip_fraction = clipped_value_loss(
            values,
            exp.values[rows],
            exp.returns[rows],
            mask,
            self.cfg.cliprange_value,
            token_weights(mask, self.cfg.loss_aggregation, self.shared.max_new_tokens),
        )
        record(weight, value_loss=loss, value_clip_fraction=clip_fraction)
        return globally_normalized(loss, weight, self.world)

    def _minibatch_loss(
        self, exp: Experience, part: Forwarded, weight: float, record: Recorder, with_ptx: bool
    ) -> Tensor:
        """This rank's part of the policy's loss on a minibatch, under autocast: the loss over
        `rows`' response tokens as `loss_aggregation` adds them up (their mean, or their
        answers' mean) times `weight`, their share of the minibatch's tokens (or answers),
        and the number of ranks, so that the parts added up over microbatches and averaged
        over ranks (DDP, FSDP2) are the minibatch's loss; `with_ptx`: the pretraining mix,
        which one microbatch of each minibatch adds."""
        cfg, rollout, rows = self.cfg, exp.rollout, part.rows
        mask = rollout.response_mask[rows]
        out = response_forward(
            self.policy,
            part.ids,
            part.real,
            rollout.prompt_width,
            self.shared.temperature,
            part.packing,
            entropy_grad=cfg.entropy_coef > 0,
        )
        weights = token_weights(mask, cfg.loss_aggregation, self.shared.max_new_tokens)
        policy = self.algorithm.policy_loss(
            out.logprobs, exp.old_logprobs[rows], exp.advantages[rows], mask, weights, cfg
        )
        # at weight 0 the entropy is only logged: no backward pass through it
        assert out.entropy is not None
        mean_entropy = aggregate(out.entropy, mask, weights)
        loss = policy.loss - cfg.entropy_coef * mean_entropy
        if self.algorithm.kl_penalty == "loss":
            kl = aggregate(kl_per_token(out.logprobs, exp.ref_logprobs[rows], "k3"), mask, weights)
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
                weights,
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
        parts: list[tuple[Forwarded, float]],
        loss_of: Callable[[Forwarded, float, bool], Tensor],
        names: tuple[str, str],
        terms: Callable[[], Terms],
    ) -> None:
        """One optimizer step on the gradients of every part (rows, share) added up:
        `loss_of(part, share, last)` forward under autocast and backward, part by part, the
        gradients reduced across ranks with the last. Unless the loss summed over the parts
        or the gradient norm (`names` name them) is not finite: every rank checks the same
        reduced values, so all stop or none, before the update."""
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for index, (part, share) in enumerate(parts):
            last = index == len(parts) - 1
            with held.accumulating(last):
                with autocast(self.device, self.cfg.bf16):
                    loss = held.loss(loss_of, part, share, last)
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
        # what a row weighs in a minibatch's loss: its tokens, or one answer's worth
        units = answered if cfg.loss_aggregation == "token_mean" else [1] * batch
        starts = range(0, batch, cfg.minibatch_size)
        trained_tokens = 0
        epochs_run = 0
        for _ in range(passes):
            order = torch.randperm(batch, generator=self.shuffle_rng).tolist()
            weighed: list[Recorded] = []  # this rank's statistics, per minibatch
            for start in starts:
                minibatch = order[start : start + cfg.minibatch_size]
                total = sum(units[row] for row in minibatch)  # what the loss averages over
                parts = [  # each packed once, for the policy and the critic alike
                    (
                        forwarded(rollout, part.rows, lengths, self.policy),
                        sum(units[row] for row in part.rows) / total if part.counts else 0.0,
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
                    lambda part, share, last: self._minibatch_loss(exp, part, share, record, last),
                    ("loss", "policy_grad_norm"),
                    lambda: added_up(current) | inputs,
                )
                if self.held_critic is not None and self.critic_opt is not None:
                    self._accumulated_step(
                        self.held_critic,
                        self.critic_opt,
                        parts,
                        lambda part, share, _: self._critic_loss(exp, part, share, record),
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
        experience, stats = self._experience()
        stats |= self.update(experience)
        self.kl_ctl.update(stats["kl"], len(experience.rollout.prompts))
        self.step += 1
        stats["step"] = self.step
        stats["lr"] = lr
        return stats, experience

    def _experience(self) -> tuple[Experience, dict[str, float]]:
        """This iteration's experience and the statistics of its (first) rollout: the rollout
        of its prompts, or under dynamic sampling (`max_sampling_rounds` > 1) the informative
        groups of as many rollouts as fill the batch, round r's prompts from the shuffle of
        seed + r."""
        cfg, beta, stats = self.cfg, self.kl_ctl.beta, {}

        def sample(round_: int) -> Experience:
            rows = prompt_schedule(len(self.prompts), cfg.batch_size, self.seed + round_, self.step)
            experience, found = self.experience.make([self.prompts[i] for i in rows], beta)
            stats.update(found if round_ == 0 else {})
            return experience

        rounds = cfg.max_sampling_rounds if isinstance(cfg, GRPOParams) else 1
        if rounds == 1:
            return sample(0), stats
        experience, sampled = informative_batch(
            sample, cfg.batch_size, cfg.group_size, rounds, self.tokenizer.pad_id
        )
        return experience, stats | sampled

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
            "sample_rng": self.experience.sample_rng.get_state(),
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
        self.experience.sample_rng.set_state(state["sample_rng"])
        self.shuffle_rng.set_state(state["shuffle_rng"])
        version, _, gauss = self.ptx_rng.getstate()
        self.ptx_rng.setstate((version, tuple(int(x) for x in state["ptx_rng"]), gauss))
        if self.held_critic is not None and self.critic_opt is not None:
            self.held_critic.load(self.critic_opt, state["critic"], state["critic_opt"])

    def whole_policy(self) -> Backbone:
        """The policy, whole (every rank must call it: under fsdp2 it gathers a copy)."""
        return self.held_policy.whole_model()
