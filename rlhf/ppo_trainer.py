"""One PPO iteration at a time: rollout, scoring, advantages, clipped updates.

The policy and the frozen reference both start as the SFT model; the critic starts as the
reward model (InstructGPT) or is a value head on the policy trunk. The KL penalty to the
reference is part of every token's reward, so it reaches the policy through the advantages of
the very tokens that drifted (not as a detached number added to a loss).

Everything a resumed run needs (models, optimizers, KL coefficient, step, every RNG) comes out
of `state_dict()`, so an interrupted run picks up exactly where it stopped.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlhf.data import Example, collate
from rlhf.generation import SamplingConfig
from rlhf.model import GPT
from rlhf.params import PPOParams
from rlhf.ppo import (
    KLController,
    clipped_policy_loss,
    clipped_value_loss,
    entropy,
    explained_variance,
    gae,
    kl_per_token,
    masked_mean,
    reinforce_loss,
    sequence_advantages,
    token_rewards,
    whiten,
)
from rlhf.rewards import Scorer
from rlhf.rollout import Rollout, response_forward, response_values, sample_rollout
from rlhf.tokenizer import Tokenizer
from rlhf.training import adamw, autocast, lr_at, masked_lm_loss, rng_state, set_rng_state


@dataclass
class Experience:
    rollout: Rollout
    old_logprobs: Tensor  # [B, N] policy log-probs at rollout time (full forward)
    ref_logprobs: Tensor  # [B, N]
    values: Tensor  # [B, N]
    scores: Tensor  # [B] reward source's score
    rewards: Tensor  # [B] score after penalties and clipping
    non_score: Tensor  # [B, N] -beta * KL per token
    advantages: Tensor  # [B, N] whitened
    returns: Tensor  # [B, N]


def critic_from_reward_model(reward_model: GPT) -> GPT:
    """The reward model with its reward head copied into the value head: at the first update
    the critic already predicts roughly what the episode will score."""
    with torch.no_grad():
        reward_model.value_head.weight.copy_(reward_model.reward_head.weight)
        reward_model.value_head.bias.copy_(reward_model.reward_head.bias)
    return reward_model


class PPOTrainer:
    def __init__(
        self,
        policy: GPT,
        reference: GPT,
        critic: GPT | None,
        scorer: Scorer,
        tokenizer: Tokenizer,
        cfg: PPOParams,
        *,
        total_steps: int,
        seed: int,
        ptx_examples: Sequence[Example] = (),
    ):
        """critic None: a value head on the policy trunk (`ppo.critic: shared`)."""
        self.policy, self.reference, self.critic = policy, reference, critic
        self.scorer, self.tokenizer, self.cfg = scorer, tokenizer, cfg
        self.total_steps = total_steps
        self.ptx_examples = list(ptx_examples)
        self.device = next(policy.parameters()).device
        betas = (cfg.beta1, cfg.beta2)
        self.policy_opt = adamw(policy, cfg.lr, cfg.weight_decay, betas)
        self.critic_opt = adamw(critic, cfg.critic_lr, cfg.weight_decay, betas) if critic else None
        self.kl_ctl = KLController(cfg.kl_coef, cfg.kl_target or None, cfg.kl_horizon)
        self.sampling = SamplingConfig(
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
        )
        self.sample_rng = torch.Generator(self.device).manual_seed(seed)
        self.shuffle_rng = torch.Generator().manual_seed(seed + 1)
        self.ptx_rng = random.Random(seed + 2)
        self.step = 0
        for model in (policy, reference, critic):
            if model is not None:
                model.eval()  # dropout off everywhere: it would make the PPO ratios noise
        reference.requires_grad_(False)

    # -- experience ------------------------------------------------------------------------
    @torch.no_grad()
    def make_experience(self, prompts: Sequence[str]) -> tuple[Experience, dict[str, float]]:
        cfg = self.cfg
        started = time.perf_counter()
        rollout = sample_rollout(
            self.policy, self.tokenizer, prompts, self.sampling, self.sample_rng
        )
        rollout_s = time.perf_counter() - started

        started = time.perf_counter()
        args = (rollout.sequences, rollout.attention_mask, rollout.prompt_width, cfg.temperature)
        with autocast(self.device, cfg.bf16):
            policy_out = response_forward(self.policy, *args)
            ref_logprobs = response_forward(self.reference, *args).logprobs
            if self.critic is None:
                values = self.policy.values(policy_out.hidden).float()
            else:
                values = response_values(
                    self.critic, rollout.sequences, rollout.attention_mask, rollout.prompt_width
                )
        mask = rollout.response_mask.float()
        scores = self.scorer(rollout.prompts, rollout.responses).to(self.device)
        rewards = scores - cfg.missing_eos_penalty * (~rollout.ended).float()
        rewards = rewards - cfg.length_penalty * rollout.lengths.float()
        rewards = rewards.clamp(-cfg.reward_clip, cfg.reward_clip)
        kl = kl_per_token(policy_out.logprobs, ref_logprobs) * mask
        per_token, non_score = token_rewards(rewards, kl, mask, self.kl_ctl.beta)
        if cfg.algo == "reinforce":
            advantages, returns = sequence_advantages(per_token, values, mask)
        else:
            advantages, returns = gae(per_token, values, mask, cfg.gamma, cfg.lam)
        scoring_s = time.perf_counter() - started

        experience = Experience(
            rollout=rollout,
            old_logprobs=policy_out.logprobs,
            ref_logprobs=ref_logprobs,
            values=values * mask,
            scores=scores,
            rewards=rewards,
            non_score=non_score,
            advantages=whiten(advantages, mask),
            returns=returns,
        )
        logged_kl = kl_per_token(policy_out.logprobs, ref_logprobs, cfg.kl_estimator) * mask
        generated = float(mask.sum())
        stats = {
            "score": float(scores.mean()),
            "reward": float(rewards.mean()),
            "non_score_reward": float(non_score.sum(-1).mean()),
            "kl": float(logged_kl.sum(-1).mean()),
            "beta": self.kl_ctl.beta,
            "response_length": float(rollout.lengths.float().mean()),
            "end_token_rate": float(rollout.ended.float().mean()),
            "explained_variance": explained_variance(values, returns, mask),
            "rollout_tokens_per_s": generated / rollout_s,
            "rollout_s": rollout_s,
            "scoring_s": scoring_s,
        }
        return experience, stats

    # -- update ----------------------------------------------------------------------------
    def _ptx_loss(self) -> Tensor:
        batch = self.ptx_rng.sample(
            self.ptx_examples, min(self.cfg.ptx_batch_size, len(self.ptx_examples))
        )
        inputs, targets = collate(batch, self.tokenizer.pad_id)
        return masked_lm_loss(self.policy, inputs.to(self.device), targets.to(self.device))

    def _critic_step(self, exp: Experience, rows: Tensor) -> tuple[Tensor, Tensor]:
        assert self.critic is not None and self.critic_opt is not None
        part = exp.rollout
        values = response_values(
            self.critic, part.sequences[rows], part.attention_mask[rows], part.prompt_width
        )
        mask = part.response_mask[rows].float()
        loss, clip_fraction = clipped_value_loss(
            values, exp.values[rows], exp.returns[rows], mask, self.cfg.cliprange_value
        )
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.critic.parameters(), self.cfg.grad_clip)
        self.critic_opt.step()
        return loss.detach(), clip_fraction

    def update(self, exp: Experience) -> dict[str, float]:
        cfg = self.cfg
        started = time.perf_counter()
        self.policy.train()
        if self.critic is not None:
            self.critic.train()
        totals: dict[str, list[float]] = {}

        def record(**values: float | Tensor) -> None:
            for key, value in values.items():
                totals.setdefault(key, []).append(
                    float(value.detach() if isinstance(value, Tensor) else value)
                )

        rollout, batch = exp.rollout, exp.rollout.sequences.shape[0]
        trained_tokens = 0
        epochs_run = 0
        for _ in range(1 if cfg.algo == "reinforce" else cfg.ppo_epochs):
            order = torch.randperm(batch, generator=self.shuffle_rng).to(self.device)
            epoch_kl = []
            for start in range(0, batch, cfg.minibatch_size):
                rows = order[start : start + cfg.minibatch_size]
                mask = rollout.response_mask[rows].float()
                with autocast(self.device, cfg.bf16):
                    out = response_forward(
                        self.policy,
                        rollout.sequences[rows],
                        rollout.attention_mask[rows],
                        rollout.prompt_width,
                        cfg.temperature,
                    )
                    if cfg.algo == "reinforce":
                        policy = reinforce_loss(
                            out.logprobs, exp.old_logprobs[rows], exp.advantages[rows], mask
                        )
                    else:
                        policy = clipped_policy_loss(
                            out.logprobs, exp.old_logprobs[rows], exp.advantages[rows], mask,
                            cfg.cliprange,
                        )  # fmt: skip
                    # at weight 0 the entropy is only logged: no backward pass through it
                    with torch.set_grad_enabled(cfg.entropy_coef > 0):
                        mean_entropy = masked_mean(entropy(out.logits), mask)
                    loss = policy.loss - cfg.entropy_coef * mean_entropy
                    if self.critic is None:
                        values = self.policy.values(out.hidden).float()
                        value_loss, value_clip = clipped_value_loss(
                            values, exp.values[rows], exp.returns[rows], mask, cfg.cliprange_value
                        )
                        loss = loss + cfg.vf_coef * value_loss
                    if cfg.ptx_coef > 0 and self.ptx_examples:
                        ptx = self._ptx_loss()
                        loss = loss + cfg.ptx_coef * ptx
                        record(ptx_loss=ptx)
                self.policy_opt.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.grad_clip)
                self.policy_opt.step()
                if self.critic is not None:
                    with autocast(self.device, cfg.bf16):
                        value_loss, value_clip = self._critic_step(exp, rows)
                record(
                    policy_loss=policy.loss,
                    value_loss=value_loss,
                    clip_fraction=policy.clip_fraction,
                    value_clip_fraction=value_clip,
                    approx_kl=policy.approx_kl,
                    entropy=mean_entropy,
                )
                epoch_kl.append(float(policy.approx_kl))
                trained_tokens += int(rollout.attention_mask[rows].sum())
            epochs_run += 1
            if cfg.target_approx_kl and sum(epoch_kl) / len(epoch_kl) > cfg.target_approx_kl:
                break
        self.policy.eval()
        if self.critic is not None:
            self.critic.eval()
        update_s = time.perf_counter() - started
        return {
            **{key: sum(v) / len(v) for key, v in totals.items()},
            "ppo_epochs_run": epochs_run,
            "update_tokens_per_s": trained_tokens / update_s,
            "update_s": update_s,
        }

    # -- one iteration ---------------------------------------------------------------------
    def iteration(self, prompts: Sequence[str]) -> tuple[dict[str, float], Experience]:
        """Rollout, score, update; then adapt beta to the KL this rollout measured."""
        cfg = self.cfg
        for opt, peak in ((self.policy_opt, cfg.lr), (self.critic_opt, cfg.critic_lr)):
            if opt is not None:
                lr = lr_at(self.step, peak, cfg.warmup_steps, self.total_steps, cfg.min_lr_ratio)
                for group in opt.param_groups:
                    group["lr"] = lr
        experience, stats = self.make_experience(prompts)
        stats |= self.update(experience)
        self.kl_ctl.update(stats["kl"], len(prompts))
        self.step += 1
        stats["step"] = self.step
        stats["lr"] = self.policy_opt.param_groups[0]["lr"]
        return stats, experience

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "step": self.step,
            "policy": self.policy.state_dict(),
            "policy_opt": self.policy_opt.state_dict(),
            "kl_ctl": self.kl_ctl.state(),
            "rng": rng_state(),
            "sample_rng": self.sample_rng.get_state(),
            "shuffle_rng": self.shuffle_rng.get_state(),
            "ptx_rng": list(self.ptx_rng.getstate()[1]),
        }
        if self.critic is not None and self.critic_opt is not None:
            state["critic"] = self.critic.state_dict()
            state["critic_opt"] = self.critic_opt.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.policy.load_state_dict(state["policy"])
        self.policy_opt.load_state_dict(state["policy_opt"])
        self.kl_ctl.load(state["kl_ctl"])
        set_rng_state(state["rng"])
        self.sample_rng.set_state(state["sample_rng"])
        self.shuffle_rng.set_state(state["shuffle_rng"])
        version, _, gauss = self.ptx_rng.getstate()
        self.ptx_rng.setstate((version, tuple(int(x) for x in state["ptx_rng"]), gauss))
        if self.critic is not None and self.critic_opt is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_opt.load_state_dict(state["critic_opt"])
