"""The resumable training loop that SFT, the reward model and DPO share.

Every `save_every` steps the model, optimizer, RNG, step and history go to a resume file. The
batch order of each epoch is a pure function of (seed, epoch), so a run resumed from that file
continues exactly where the interrupted one was and ends with the same numbers.

Under torchrun each rank trains on its share of every global batch (`rlhf.train.distributed`)
through DistributedDataParallel or, under `train.strategy: fsdp2`, a model sharded across the
ranks (`rlhf.train.sharding`); losses, statistics and token counts are reduced over the ranks,
so the history and the resume state (written by rank 0, the whole model and optimizer) are
the same whatever the number of processes, and a run resumes with any number.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlhf.models import checkpoint
from rlhf.models.backbone import Backbone
from rlhf.params import OptimParams
from rlhf.train.device import autocast, compile_report, rng_state, set_rng_state
from rlhf.train.distributed import World, barrier, globally_normalized, sum_across
from rlhf.train.guard import NonFiniteError, grad_norm, require_finite
from rlhf.train.optim import adamw, lr_at, set_lr
from rlhf.train.sharding import hold

RESUME_KEYS = ("model", "optimizer", "rng", "step", "steps", "epochs", "extra")

# (example indices) -> (loss, tokens processed); the loss is a mean over the batch's units
BatchLoss = Callable[[list[int]], tuple[Tensor, int]]
# (example indices) -> how many units the batch loss averages over (examples, or tokens)
BatchUnits = Callable[[list[int]], int]
# (step, metric name -> value): one step's point of the training curves
OnPoint = Callable[[int, dict[str, float]], None]


@dataclass
class History:
    steps: list[dict[str, float]] = field(default_factory=list)
    epochs: list[dict[str, float]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # what the stage keeps across a resume
    tokens: int = 0  # processed by this run, every rank (throughput), not restored on resume
    seconds: float = 0.0
    resumed_from: int = 0

    @property
    def tokens_per_s(self) -> float | None:
        return round(self.tokens / self.seconds) if self.seconds else None


def curve_points(
    steps: list[dict[str, float]], epochs: list[dict[str, float]]
) -> list[tuple[int, dict[str, float]]]:
    """The training curves' point at each of `steps`: the step's row and, at the last step of
    an epoch, that epoch's row under `epoch/` (so `epoch/val_loss` is plotted against steps,
    beside the per-step `train_loss`)."""
    last_step = {row["epoch"]: row["step"] for row in steps}
    ended = {last_step[e["epoch"]]: e for e in epochs if e["epoch"] in last_step}
    points = []
    for row in steps:
        point = {k: v for k, v in row.items() if k not in ("step", "epoch")}
        if (epoch := ended.get(row["step"])) is not None:
            point |= {f"epoch/{k}": v for k, v in epoch.items() if k != "epoch"}
        points.append((int(row["step"]), point))
    return points


def global_step(
    world: World,
    loss: Tensor,
    units: int,
    tokens: int,
    stats: dict[str, float],
    device: torch.device,
) -> tuple[float | Tensor, dict[str, float], float, int]:
    """The global batch's mean loss, mean statistics, units and tokens, from this rank's
    means over its `units` (in one process, its own values untouched, the loss still on the
    device: it is read with the gradient norm, the step's one wait on the device)."""
    if not world.distributed:
        return loss.detach(), stats, units, tokens
    local = [loss.item() * units, units, tokens, *(value * units for value in stats.values())]
    summed = sum_across(world, local, device)
    total = summed[1] or 1.0  # a global batch without a single unit (no pair): loss 0
    reduced = {key: value / total for key, value in zip(stats, summed[3:], strict=True)}
    return summed[0] / total, reduced, total, round(summed[2])


def read_together(*values: float | Tensor) -> list[float]:
    """Values some of which are on the device, read in one transfer: a step waits on the
    device once, not once per value."""
    on_device = [v.detach().float().reshape(()) for v in values if isinstance(v, Tensor)]
    read = iter(torch.stack(on_device).tolist() if on_device else [])
    return [next(read) if isinstance(v, Tensor) else v for v in values]


def resume_state(
    resume_file: Path,
    fingerprint: str,
    world: World,
    log: Callable[[str], None],
    keys: Sequence[str] = RESUME_KEYS,
) -> dict[str, Any] | None:
    """The saved state to resume, the same on every rank: rank 0 reads it first (and moves
    an unreadable file aside), the others once it has. Under torchrun every rank maps it
    from the file, so N ranks hold one copy of a large model's state in memory, not N."""
    mmap = world.distributed
    state = (
        checkpoint.load_resume(resume_file, fingerprint, keys, log, mmap=mmap)
        if world.is_main
        else None
    )
    barrier(world)
    if not world.is_main:
        state = checkpoint.load_resume(resume_file, fingerprint, keys, log, mmap=mmap)
    return state


# Batches are cut from windows of this many batches sorted by length: enough to make batches
# nearly pad-free, few enough that each epoch still mixes the whole set.
BUCKET_WINDOW = 50


def batch_order(
    n_examples: int,
    seed: int,
    epoch: int,
    lengths: Sequence[int] | None = None,
    batch_size: int = 1,
) -> list[int]:
    """A seeded shuffle of the examples; with `lengths`, batches of similar length.

    Short answers padded to the longest ramble in a random batch waste over half of every
    forward pass. Bucketing sorts shuffled windows by length, cuts them into batches and
    shuffles the batches; the last, partial batch stays last so every slice of `batch_size`
    is one batch. A pure function of (seed, epoch), so a resumed run sees the same batches.
    """
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(n_examples, generator=generator).tolist()
    if lengths is None:
        return order
    window = batch_size * BUCKET_WINDOW
    order = [
        i
        for start in range(0, n_examples, window)
        for i in sorted(order[start : start + window], key=lambda i: lengths[i])
    ]
    n_full = n_examples // batch_size
    batches = [order[b * batch_size : (b + 1) * batch_size] for b in range(n_full)]
    shuffled = [batches[b] for b in torch.randperm(n_full, generator=generator).tolist()]
    return [i for batch in shuffled for i in batch] + order[n_full * batch_size :]


def fit(
    model: Backbone,
    opt: OptimParams,
    *,
    seed: int,
    n_examples: int,
    batch_loss: BatchLoss,
    evaluate: Callable[[], dict[str, float]],
    device: torch.device,
    resume_file: Path,
    fingerprint: str,
    lengths: Sequence[int] | None = None,
    units: BatchUnits = len,
    fresh_extra: Callable[[], dict[str, Any]] = dict,
    step_stats: Callable[[], dict[str, float]] = dict,
    on_step: Callable[[int, int, float], None] = lambda step, total, loss: None,
    on_point: OnPoint = lambda step, values: None,
    log: Callable[[str], None] = print,
    dropout: bool = True,
    world: World = World(),  # noqa: B008 (frozen)
    strategy: str = "ddp",
) -> tuple[History, Backbone]:
    """Train for `opt.epochs` epochs over `n_examples`; `evaluate` runs after each epoch.
    Returns the history and the trained model, whole: `model` itself, or under `strategy`
    fsdp2 with several processes a plain copy gathered from its shards (`model` then stays
    sharded; use the returned one).

    `lengths` (tokens per example) turns on length-bucketed batches (`batch_order`). `units`
    says what `batch_loss` averages over (examples by default; tokens for a token-mean loss):
    under data parallelism the global loss weighs each rank's mean by it.
    `fresh_extra` is called only on a fresh start (an untrained baseline, say); on resume its
    saved value comes back in `History.extra`. `step_stats` returns what the last batch
    measured besides its loss (DPO's implicit-reward accuracy, say) for that step's row.
    `on_point` receives each step's point of the training curves (`curve_points`), on resume
    first those of the restored history, so a fresh curve log ends with every step once.
    `dropout` False trains in eval mode: DPO's log-ratios to a reference computed without
    dropout must start at exactly zero, not at the noise dropout adds. A non-finite loss or
    gradient norm raises `NonFiniteError` before its update (`rlhf.train.guard`).
    """
    steps_per_epoch = math.ceil(n_examples / opt.batch_size)
    total = opt.epochs * steps_per_epoch
    history = History()
    state = resume_state(resume_file, fingerprint, world, log)
    if state is None:
        model.eval()
        with torch.no_grad():
            history.extra = fresh_extra()
    held = hold(model, strategy, world, device, opt.bf16)  # the optimizer takes its parameters
    optimizer = adamw(model, opt.lr, opt.weight_decay, (opt.beta1, opt.beta2))
    if state is not None:
        held.load(optimizer, state["model"], state["optimizer"])
        set_rng_state(state["rng"])
        history.steps, history.epochs, history.extra = (
            state["steps"],
            state["epochs"],
            state["extra"],
        )
        history.resumed_from = state["step"]
        log(f"resuming from step {history.resumed_from} of {total}")
        for point in curve_points(history.steps, history.epochs):
            on_point(*point)

    model.train(dropout)
    order: list[int] = []
    saved = history.resumed_from
    for step in range(history.resumed_from, total):
        epoch, index = divmod(step, steps_per_epoch)
        if index == 0 or not order:
            order = batch_order(n_examples, seed, epoch, lengths, opt.batch_size)
        started = time.perf_counter()
        lr = lr_at(step, opt.lr, opt.warmup_steps, total, opt.min_lr_ratio)
        set_lr(optimizer, lr)
        rows, holds_rows = world.shard(order[index * opt.batch_size :][: opt.batch_size])
        with autocast(device, opt.bf16):
            loss, tokens = held.loss(batch_loss, rows)
        mine = units(rows) if holds_rows else 0
        train_loss, stats, total_units, tokens = global_step(
            world, loss, mine, tokens if holds_rows else 0, step_stats(), device
        )
        optimizer.zero_grad(set_to_none=True)
        try:
            globally_normalized(loss, mine / total_units, world).backward()
            norm = grad_norm(model.parameters(), opt.grad_clip)
            train_loss, norm = read_together(train_loss, norm)
            require_finite(step + 1, {"train_loss": train_loss}, stats)
            require_finite(step + 1, {"grad_norm": norm})
        except NonFiniteError as exc:
            exc.last_good = f"{resume_file} (step {saved})" if saved else exc.last_good
            raise
        optimizer.step()
        history.seconds += time.perf_counter() - started
        history.tokens += tokens
        history.steps.append(
            {
                "step": step + 1,
                "epoch": epoch + 1,
                "lr": lr,
                "train_loss": train_loss,
                **stats,
            }
        )

        if index == steps_per_epoch - 1:
            epoch_losses = [r["train_loss"] for r in history.steps if r["epoch"] == epoch + 1]
            model.eval()
            with torch.no_grad():
                scores = held.evaluate(evaluate)
            model.train(dropout)
            history.epochs.append(
                {
                    "epoch": epoch + 1,
                    "train_loss": sum(epoch_losses) / len(epoch_losses),
                    **scores,
                }
            )
            log(
                f"epoch {epoch + 1}/{opt.epochs}: "
                + ", ".join(f"{k} {v:.4f}" for k, v in history.epochs[-1].items() if k != "epoch")
            )
        if (step + 1) % opt.save_every == 0 and step + 1 < total:
            model_state, optimizer_state = held.state(optimizer)  # every rank: gathered
            if world.is_main:
                checkpoint.save_resume(
                    resume_file,
                    fingerprint,
                    {
                        "model": model_state,
                        "optimizer": optimizer_state,
                        "rng": rng_state(),
                        "step": step + 1,
                        "steps": history.steps,
                        "epochs": history.epochs,
                        "extra": history.extra,
                    },
                )
            saved = step + 1
        on_point(*curve_points(history.steps[-1:], history.epochs)[0])
        on_step(step + 1, total, train_loss)
    if report := compile_report():
        log(report)
    model.eval()
    return history, held.whole_model()
