"""rl ALGORITHM: optimize the SFT policy with one RL algorithm, then judge it against SFT.

`python -m rlhf.stages.rl ppo` (dvc.yaml runs `rl@NAME` for every name in `rl_algorithms`).
The algorithm's params group (`ppo`, `grpo`, ...) says how it optimizes; the `rl` group what
every algorithm shares. Outputs: `artifacts/NAME/` (model, sampled answers, snapshots for the
over-optimization curve), `metrics/details/NAME.json`, and each iteration's statistics as training
curves in `dvclive/NAME/`.

`RLHF_NPROC` processes (`rlhf.stages.support.launch`) sample, score and train on shares of every
iteration's answers and compute what one process does (`rlhf.algorithms.rl.shards`).

Resume state (policy, critic, optimizers, KL coefficient, step, RNGs, history) is saved every
`rl.save_every` iterations; a killed run started again continues from there and, on CPU,
ends with the same numbers as an uninterrupted one. At the end the policy and SFT sample
held-out prompts with the same seed and judges score both: the gold score and the gold-judged
win rate over SFT beside the win rate by the reward source the policy optimized, and the KL to
SFT, tell whether RL improved the policy or only the proxy. On prompts from outside the task
suite (your own data) there is no gold judge: the gold keys are None, and the reward source's
win rate and the KL to SFT are still measured.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from rlhf.algorithms.rl.experience import MISMATCH_KEYS, Experience
from rlhf.algorithms.rl.registry import ALGORITHMS
from rlhf.algorithms.rl.trainer import RLTrainer
from rlhf.algorithms.scorers import backbones, build
from rlhf.atomic import remove_stale_in, write_text
from rlhf.data.schemas import PROMPT_SCHEMA, SFT_SCHEMA, read_rows
from rlhf.eval.policies import versus_reference
from rlhf.models import checkpoint
from rlhf.models.backbone import Backbone
from rlhf.models.lora import adapters_off, add_adapters, merged_model
from rlhf.params import ParamsError
from rlhf.params.groups import RL_ALGORITHMS, CriticParams
from rlhf.project import paths
from rlhf.project.specs import ITEM, StageSpec
from rlhf.reward_sources import ENSEMBLE, REWARD
from rlhf.stages.support.context import StageRun
from rlhf.stages.support.entry import main
from rlhf.stages.support.outputs import published, write_metrics, write_timings
from rlhf.stages.support.scoring import (
    prompt_references,
    require_sources_tracked,
    scoring_context,
)
from rlhf.stages.support.trained import finish, reporting, stage_curves
from rlhf.tokenizer.chat import encode_example
from rlhf.train.device import compile_report
from rlhf.train.guard import NonFiniteError
from rlhf.train.loop import resume_state

RESUME_KEYS = ("trainer", "history", "samples")
SAMPLES_LOGGED = 4  # answers of a rollout written to samples.jsonl when samples are due
SECONDS = ("rollout", "scoring", "update")  # the phases whose time the timings add up
# columns of the trainer's per-step rows that measure speed: to the timings, not the outputs
TIMING_COLUMNS = ("rollout_tokens_per_s", "update_tokens_per_s", *(f"{k}_s" for k in SECONDS))

SPEC = StageSpec(
    "rl",
    "rlhf.stages.rl",
    params=("seed", "device", "threads", "cpu_kernels", "memory", "train", "rl", ITEM),
    inputs=(
        paths.PROMPTS_TRAIN,
        paths.PROMPTS_HELDOUT,
        paths.SFT_TRAIN,
        paths.TOKENIZER,
        paths.SFT_MODEL,
        paths.RM_MODEL,
    ),
    outs=(paths.model_file(ITEM), paths.samples_file(ITEM), paths.snapshots_dir(ITEM)),
    # its policy's headline numbers are what evaluate measures of it (one changed RL param
    # then changes three columns of `dvc exp show --only-changed`): training's own are details
    details=paths.details_file(ITEM),
    plots=(paths.curves_folder(ITEM),),
    foreach="${rl_algorithms}",
)


def build_trainer(stage: StageRun, algorithm: str) -> RLTrainer:
    """Policy and reference from SFT, a critic from the reward model where the algorithm has
    a separate one, the reward source, and the training prompts."""
    p, tokenizer = stage.params, stage.tokenizer
    cfg = p.algorithm(algorithm)
    separate_critic = isinstance(cfg, CriticParams) and cfg.critic == "separate"
    trained = 1 + separate_critic  # the policy, and a critic of its own
    reward = p.reward()
    require_sources_tracked(stage, [reward], REWARD)
    require_sources_tracked(stage, p.ensemble(), ENSEMBLE)
    prompts = read_rows(paths.PROMPTS_TRAIN, PROMPT_SCHEMA)
    checks = [(key, value) for key, value in p.checked() if key in (REWARD, ENSEMBLE)]
    # the held-out prompts too: the trained policy's reward is measured on them (`run`)
    held_out = {paths.PROMPTS_HELDOUT: read_rows(paths.PROMPTS_HELDOUT, PROMPT_SCHEMA)}
    references = prompt_references({paths.PROMPTS_TRAIN: prompts, **held_out}, checks)
    # the reward models held beside them: the trained one, and the ensemble's folders
    rewarded = (reward.kind.reads == "reward_model") + sum(
        member.path is not None for member in p.ensemble()
    )
    lora = p.rl.lora_rank > 0  # then adapters train, and the policy is its own reference
    # full-context rows one forward and backward pass of the update holds (`microbatches`)
    micro_sequences = min(cfg.minibatch_size, -(-p.rl.microbatch_tokens // p.model.block_size))
    work = stage.workload(
        trained=0 if lora else trained,
        adapted=trained if lora else 0,
        frozen=rewarded if lora else 1 + rewarded,  # the reference, unless adapters are off
        sequences=micro_sequences + (cfg.ptx_batch_size if cfg.ptx_coef > 0 else 0),
        sampled=cfg.batch_size * cfg.group_size,
    )
    stage.preflight(paths.SFT_MODEL, work)
    policy = stage.load_model(paths.SFT_MODEL)
    critic = None
    if separate_critic:
        critic = stage.load_model(paths.RM_MODEL)
        critic.init_value_head_from_reward_head()
    if lora:
        for model in (policy, critic):
            if model is not None:
                add_adapters(model, p.rl.lora_rank, p.rl.lora_alpha)
    context = scoring_context(stage, references, p.rl)
    scorer = build(reward, context)
    for model in backbones(scorer):
        stage.compiled(model)
    demos = read_rows(paths.SFT_TRAIN, SFT_SCHEMA) if cfg.ptx_coef > 0 else []
    block = p.model.block_size
    return RLTrainer(
        ALGORITHMS[algorithm],
        cfg,
        p.rl,
        policy=policy,
        reference=None if lora else stage.load_frozen(paths.SFT_MODEL),
        critic=critic,
        scorer=scorer,
        tokenizer=tokenizer,
        prompts=[r["prompt"] for r in prompts],
        seed=p.seed,
        ptx_examples=[encode_example(tokenizer, d["prompt"], d["response"], block) for d in demos],
        world=stage.world,
        strategy=p.train.strategy,
    )


def logged_samples(step: int, experience: Experience) -> list[dict[str, Any]]:
    rollout = experience.rollout
    return [
        {
            "step": step,
            "prompt": rollout.prompts[i],
            "response": rollout.responses[i],
            "score": round(float(experience.scores[i]), 4),
        }
        for i in range(min(SAMPLES_LOGGED, len(rollout.prompts)))
    ]


def curve_point(stats: dict[str, float]) -> tuple[int, dict[str, float]]:
    """An iteration's point of the training curves: its statistics but their speed."""
    values = {k: v for k, v in stats.items() if k != "step" and k not in TIMING_COLUMNS}
    return int(stats["step"]), values


def mean(rows: list[dict[str, float]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def summary(history: list[dict[str, float]], trainer: RLTrainer) -> dict[str, Any]:
    """The run's final score and KL (the last iterations, smoothed)."""
    last = history[-min(len(history), 5) :]
    return {
        "score": round(mean(last, "score"), 4),
        "kl": round(mean(last, "kl"), 4),
        "steps": trainer.step,
        "beta": round(trainer.kl_ctl.beta, 6),
        **{key: float(f"{history[-1][key]:.3g}") for key in MISMATCH_KEYS},
    }


def timings(history: list[dict[str, float]]) -> dict[str, Any]:
    """Throughput of rollouts and updates, and the time each phase took in all."""
    return {
        "rollout_tokens_per_s": round(mean(history, "rollout_tokens_per_s")),
        "update_tokens_per_s": round(mean(history, "update_tokens_per_s")),
        **{f"seconds_{k}": round(sum(r[f"{k}_s"] for r in history), 1) for k in SECONDS},
    }


def snapshot_staging(stage: StageRun) -> Path:
    """Where snapshots gather during training: beside the resume state, outside the outs DVC
    deletes before a rerun, so a resumed run still publishes those taken before it stopped."""
    return paths.RESUME / f"{stage.spec.item}_snapshots"


def policy_payload(stage: StageRun, policy: Backbone, step: int) -> dict[str, Any]:
    """The checkpoint of a whole policy (`RLTrainer.whole_policy`): adapters merged in."""
    return stage.payload(policy, kind="policy", step=step, algo=stage.spec.item)


def judged_pair(
    trainer: RLTrainer, policy: Backbone
) -> tuple[Backbone, Backbone, contextlib.AbstractContextManager]:
    """The trained policy as judged, its reference, and the context they are judged in: the
    policy against the frozen SFT model, or an adapted policy merged against itself with its
    adapters off."""
    if trainer.reference is not None:
        return policy, trainer.reference, contextlib.nullcontext()
    return merged_model(policy), policy, adapters_off(policy)


def train(stage: StageRun, trainer: RLTrainer) -> tuple[list[dict[str, float]], list[dict]]:
    """Iterate to `steps`, resuming from saved state, logging samples, curves and taking
    snapshots; returns the per-iteration statistics and the logged samples. Every rank
    computes the same statistics; rank 0 alone writes snapshots and the resume state."""
    shared, steps, staging = stage.params.rl, trainer.cfg.steps, snapshot_staging(stage)
    fingerprint, resume = stage.fingerprint(), stage.spec.resume_file
    writes = stage.world.is_main
    history: list[dict[str, float]] = []
    samples: list[dict[str, Any]] = []
    state = resume_state(resume, fingerprint, stage.world, stage.log, RESUME_KEYS)
    if state is not None:
        trainer.load_state_dict(state["trainer"])
        history, samples = state["history"], json.loads(state["samples"])
        stage.log(f"resuming from iteration {trainer.step} of {steps}")
    elif writes:
        shutil.rmtree(staging, ignore_errors=True)
    if writes:
        staging.mkdir(parents=True, exist_ok=True)
        remove_stale_in(staging)  # a snapshot half-written when the last run was killed
    saved = trainer.step
    with reporting(stage) as (bar, curves):
        for stats in history:  # a fresh curve log holds the restored iterations too
            curves.log(*curve_point(stats))
        task = bar.add_task(stage.spec.address, total=steps, completed=trainer.step, extra="")
        while trainer.step < steps:
            try:
                stats, experience = trainer.iteration()
            except NonFiniteError as exc:
                exc.last_good = f"{resume} (iteration {saved})" if saved else exc.last_good
                raise
            history.append(stats)
            curves.log(*curve_point(stats))
            step, more = trainer.step, trainer.step < steps
            if step % shared.log_samples_every == 0 or step == 1:
                samples += logged_samples(step, experience)
                for s in samples[-SAMPLES_LOGGED:]:
                    stage.log(f"[{s['score']:+.2f}] {s['prompt']!r} -> {s['response']!r}")
            bar.update(
                task,
                completed=step,
                extra=f"score {stats['score']:+.3f} kl {stats['kl']:.3f} beta {stats['beta']:.3f}",
            )
            # every rank gathers (fsdp2) what rank 0 writes
            if more and shared.snapshot_every and step % shared.snapshot_every == 0:
                policy = trainer.whole_policy()
                if writes:
                    checkpoint.save(
                        staging / f"step_{step:05d}.pt", policy_payload(stage, policy, step)
                    )
            if more and step % shared.save_every == 0:
                state = {
                    "trainer": trainer.state_dict(),
                    "history": history,
                    "samples": json.dumps(samples),
                }
                if writes:
                    checkpoint.save_resume(resume, fingerprint, state)
                saved = step
    if report := compile_report():
        stage.log(report)
    return history, samples


def publish(
    stage: StageRun,
    payload: dict[str, Any],
    history: list[dict[str, float]],
    samples: list[dict[str, Any]],
    metrics: dict[str, Any],
) -> None:
    """Write every output, all together, and only then drop the resume state, the live
    curves and the snapshot staging folder; the speed of each step goes to the timings."""
    algorithm, staging = stage.spec.item, snapshot_staging(stage)
    assert algorithm is not None
    with published(stage.spec) as out:
        checkpoint.save(out[paths.model_file(algorithm)], payload)
        shutil.copytree(staging, out[paths.snapshots_dir(algorithm)])
        stage_curves(out, stage.spec)
        lines = "".join(json.dumps(s) + "\n" for s in samples)
        write_text(out[paths.samples_file(algorithm)], lines)
        write_metrics(out, stage.spec, metrics)
    step_timings = [{"step": r["step"], **{k: r[k] for k in TIMING_COLUMNS}} for r in history]
    write_timings(algorithm, timings(history), step_timings)
    finish(stage.spec)
    shutil.rmtree(staging)


def run(algorithm: str) -> dict[str, Any]:
    if algorithm not in RL_ALGORITHMS:
        raise ParamsError(f"RL algorithm {algorithm!r} is not one of {', '.join(RL_ALGORITHMS)}")
    stage = StageRun.start(SPEC, algorithm)
    p, shared = stage.params, stage.params.rl
    trainer = build_trainer(stage, algorithm)
    history, samples = train(stage, trainer)
    trained = trainer.whole_policy()  # every rank: gathered under fsdp2
    if not stage.world.is_main:  # rank 0 judges the policy and publishes
        return {}
    heldout = read_rows(paths.PROMPTS_HELDOUT, PROMPT_SCHEMA)
    policy, reference, judged_as_reference = judged_pair(trainer, trained)
    with judged_as_reference:
        metrics = summary(history, trainer) | versus_reference(
            policy, reference, stage.tokenizer, heldout,
            reward=(shared.reward, trainer.experience.scorer), samples=shared.eval_samples,
            max_new_tokens=shared.max_new_tokens, seed=p.seed,
            batch_size=shared.eval_batch_size,
        )  # fmt: skip
    publish(stage, policy_payload(stage, trained, trainer.step), history, samples, metrics)
    rates = ", ".join(f"{judge} {rate}" for judge, rate in metrics["win_rate_vs_sft"].items())
    stage.log(
        f"gold sampled {metrics['gold_sampled']} (SFT {metrics['gold_sampled_sft']}), win rate "
        f"vs SFT by {rates}, KL to SFT {metrics['kl_to_sft']}, score "
        f"{metrics['score']}, {timings(history)['rollout_tokens_per_s']} rollout tokens/s"
    )
    return metrics


def run_from_command_line(args: list[str]) -> dict[str, Any]:
    if len(args) != 1:
        raise ParamsError(f"usage: python -m rlhf.stages.rl ALGORITHM ({', '.join(RL_ALGORITHMS)})")
    return run(args[0])


if __name__ == "__main__":
    main(lambda: run_from_command_line(sys.argv[1:]), data_parallel=True)
