"""ppo: optimize the SFT policy against the reward model with PPO, then judge it against SFT.

`ppo.algo: reinforce` swaps the update for REINFORCE with the critic as baseline (one
advantage per answer, one pass, no clipping) on the same rollouts and rewards; the checkpoint
records which, and the evaluation names the policy after it.

Resume state (policy, critic, optimizers, KL coefficient, step, RNGs, history) is saved every
`ppo.save_every` iterations; a killed run started again continues from there and, on CPU,
ends with the same numbers as an uninterrupted one.

The evaluation samples the PPO and the SFT policy on held-out prompts with the same seed and
has the gold judge score both: the mean gold score, the win rate over SFT (ties half) and the
KL to SFT are what tell whether RL improved the policy or only the proxy reward.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import torch

from rlhf import checkpoint
from rlhf.atomic import atomic_path, write_csv, write_json, write_text
from rlhf.data import PROMPT_SCHEMA, SFT_SCHEMA, encode_example, read_rows
from rlhf.evaluation import gold_summary
from rlhf.generation import SamplingConfig
from rlhf.model import GPT
from rlhf.params import Params, group_hash
from rlhf.policy_eval import sample_policy
from rlhf.ppo_trainer import PPOTrainer, critic_from_reward_model
from rlhf.rewards import make_scorer
from rlhf.tokenizer import Tokenizer, load_tokenizer
from rlhf.trainer import batch_order
from rlhf.training import resolve_device
from rlhf.win_rates import win_rate
from stages import paths
from stages.common import console, file_digest, params, progress

RESUME_FILE = paths.RESUME / "ppo.pt"
# Snapshots gather beside the resume state, outside the outs DVC deletes before a rerun, so a
# resumed run still publishes the ones taken before it was interrupted.
SNAPSHOT_STAGING = paths.RESUME / "ppo_snapshots"
PARAM_GROUPS = ("seed", "device", "ppo")
SAMPLES_LOGGED = 4


def prompt_schedule(n_prompts: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Prompt indices of iteration `step`: consecutive slices of per-epoch shuffles."""
    first, last = step * batch_size, (step + 1) * batch_size
    orders = {
        e: batch_order(n_prompts, seed, e)
        for e in range(first // n_prompts, (last - 1) // n_prompts + 1)
    }
    return [orders[p // n_prompts][p % n_prompts] for p in range(first, last)]


def evaluate_against_sft(
    policy: GPT, sft: GPT, tokenizer: Tokenizer, heldout: list[dict[str, Any]], p: Params
) -> dict[str, Any]:
    """Gold score, win rate and KL to SFT on held-out prompts, sampled at temperature 1."""
    config = SamplingConfig(max_new_tokens=p.ppo.max_new_tokens)
    prompts = [r["prompt"] for r in heldout]
    tasks = [r["task"] for r in heldout for _ in range(p.ppo.eval_samples)]
    common = dict(
        n=p.ppo.eval_samples, config=config, seed=p.seed, batch_size=p.ppo.eval_batch_size
    )
    ppo_samples = sample_policy(policy, tokenizer, prompts, reference=sft, **common)
    sft_samples = sample_policy(sft, tokenizer, prompts, **common)
    ppo_summary = gold_summary(ppo_samples.prompts, tasks, ppo_samples.responses)
    sft_summary = gold_summary(sft_samples.prompts, tasks, sft_samples.responses)
    return {
        "gold_sampled": ppo_summary["mean"],
        "gold_sampled_sft": sft_summary["mean"],
        "gold_sampled_by_task": ppo_summary["by_task"],
        "gold_sampled_sft_by_task": sft_summary["by_task"],
        "win_rate_vs_sft": round(win_rate(ppo_summary["scores"], sft_summary["scores"]), 4),
        "kl_to_sft": round(sum(ppo_samples.kl_to_reference) / len(ppo_samples.kl_to_reference), 4),
    }


def run() -> dict[str, Any]:
    p = params()
    cfg = p.ppo
    torch.manual_seed(p.seed)
    device = resolve_device(p.device)
    tokenizer = load_tokenizer(paths.TOKENIZER)
    policy, _ = checkpoint.load_model(paths.SFT_MODEL, tokenizer, device)
    reference, _ = checkpoint.load_model(paths.SFT_MODEL, tokenizer, device)
    critic = None
    if cfg.critic == "separate":
        critic = critic_from_reward_model(
            checkpoint.load_model(paths.RM_MODEL, tokenizer, device)[0]
        )
    scorer = make_scorer(
        cfg.reward, tokenizer, device, paths.RM_MODEL, cfg.ensemble, cfg.ensemble_reduce
    )
    prompts = read_rows(paths.PROMPTS_TRAIN, PROMPT_SCHEMA)
    heldout = read_rows(paths.PROMPTS_HELDOUT, PROMPT_SCHEMA)
    demos = read_rows(paths.SFT_TRAIN, SFT_SCHEMA)
    block = policy.config.block_size
    ptx = [encode_example(tokenizer, d["prompt"], d["response"], block) for d in demos]
    trainer = PPOTrainer(
        policy, reference, critic, scorer, tokenizer, cfg,
        total_steps=cfg.steps, seed=p.seed, ptx_examples=ptx if cfg.ptx_coef > 0 else (),
    )  # fmt: skip

    def policy_payload() -> dict[str, Any]:
        return checkpoint.model_payload(
            policy,
            tokenizer,
            group_hash(p, *PARAM_GROUPS),
            kind="policy",
            step=trainer.step,
            algo=cfg.algo,
        )

    fingerprint = group_hash(p, *PARAM_GROUPS) + file_digest(
        paths.SFT_MODEL, paths.RM_MODEL, paths.PROMPTS_TRAIN, paths.SFT_TRAIN
    )
    history: list[dict[str, float]] = []
    samples: list[dict[str, Any]] = []
    state = checkpoint.load_resume(RESUME_FILE, fingerprint)
    if state is not None:
        trainer.load_state_dict(state["trainer"])
        history, samples = state["history"], json.loads(state["samples"])
        console.print(f"ppo: resuming from iteration {trainer.step} of {cfg.steps}")
    else:
        shutil.rmtree(SNAPSHOT_STAGING, ignore_errors=True)
    SNAPSHOT_STAGING.mkdir(parents=True, exist_ok=True)

    with progress() as bar:
        task = bar.add_task("ppo", total=cfg.steps, completed=trainer.step, extra="")
        while trainer.step < cfg.steps:
            rows = prompt_schedule(len(prompts), cfg.batch_size, p.seed, trainer.step)
            stats, experience = trainer.iteration([prompts[i]["prompt"] for i in rows])
            history.append(stats)
            if trainer.step % cfg.log_samples_every == 0 or trainer.step == 1:
                logged = [
                    {
                        "step": trainer.step,
                        "prompt": experience.rollout.prompts[i],
                        "response": experience.rollout.responses[i],
                        "score": round(float(experience.scores[i]), 4),
                    }
                    for i in range(min(SAMPLES_LOGGED, len(rows)))
                ]
                samples += logged
                for s in logged:
                    console.print(f"ppo: [{s['score']:+.2f}] {s['prompt']!r} -> {s['response']!r}")
            bar.update(
                task,
                completed=trainer.step,
                extra=f"score {stats['score']:+.3f} kl {stats['kl']:.3f} beta {stats['beta']:.3f}",
            )
            snapshot_due = cfg.snapshot_every and trainer.step % cfg.snapshot_every == 0
            if snapshot_due and trainer.step < cfg.steps:  # the last one is the model itself
                checkpoint.save(SNAPSHOT_STAGING / f"step_{trainer.step:05d}.pt", policy_payload())
            if trainer.step % cfg.save_every == 0 and trainer.step < cfg.steps:
                checkpoint.save_resume(
                    RESUME_FILE,
                    fingerprint,
                    {
                        "trainer": trainer.state_dict(),
                        "history": history,
                        "samples": json.dumps(samples),
                    },
                )

    evaluation = evaluate_against_sft(policy, reference, tokenizer, heldout, p)
    last = history[-min(len(history), 5) :]  # the last iterations, smoothed
    metrics = {
        "score": round(sum(r["score"] for r in last) / len(last), 4),
        "kl": round(sum(r["kl"] for r in last) / len(last), 4),
        "steps": trainer.step,
        "rollout_tokens_per_s": round(
            sum(r["rollout_tokens_per_s"] for r in history) / len(history)
        ),
        "update_tokens_per_s": round(sum(r["update_tokens_per_s"] for r in history) / len(history)),
        "seconds_rollout": round(sum(r["rollout_s"] for r in history), 1),
        "seconds_scoring": round(sum(r["scoring_s"] for r in history), 1),
        "seconds_update": round(sum(r["update_s"] for r in history), 1),
        "beta": round(trainer.kl_ctl.beta, 6),
        **evaluation,
    }
    checkpoint.save(paths.PPO_MODEL, policy_payload())
    with atomic_path(paths.PPO_SNAPSHOTS) as staged:
        shutil.copytree(SNAPSHOT_STAGING, staged)
    write_csv(paths.PPO_STEPS, history)
    write_text(paths.PPO_SAMPLES, "".join(json.dumps(s) + "\n" for s in samples))
    write_json(paths.PPO_METRICS, metrics)
    RESUME_FILE.unlink(missing_ok=True)
    shutil.rmtree(SNAPSHOT_STAGING)
    console.print(
        f"ppo: gold sampled {metrics['gold_sampled']} (SFT {metrics['gold_sampled_sft']}), "
        f"win rate vs SFT {metrics['win_rate_vs_sft']}, KL to SFT {metrics['kl_to_sft']}, "
        f"score {metrics['score']}, {metrics['rollout_tokens_per_s']} rollout tokens/s"
    )
    return metrics


if __name__ == "__main__":
    run()
