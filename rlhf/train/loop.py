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
from rlhf.params.groups import OptimParams
from rlhf.train.batches import Readback, batch_order
from rlhf.train.device import autocast, compile_report, rng_state, set_rng_state
from rlhf.train.distributed import World, barrier, globally_normalized, sum_across
from rlhf.train.guard import NonFiniteError, grad_norm, require_finite
from rlhf.train.optim import adamw, lr_at, set_lr
from rlhf.train.sharding import Holder, hold

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


@dataclass(frozen=True)
class Objective:
    """What a stage trains: the loss of a batch (example indices -> mean loss, tokens) and
    what it averages over (`units`: examples by default; tokens for a token-mean loss, which
    data parallelism weighs each rank's mean by), what else the batch measured for that
    step's row (`step_stats`: DPO's implicit-reward accuracy, say), the evaluation after each
    epoch, and what a fresh start records before training (`fresh_extra`: an untrained
    baseline, say; on resume its saved value comes back in `History.extra`)."""

    batch_loss: BatchLoss
    units: BatchUnits = len
    step_stats: Callable[[], dict[str, float]] = dict
    evaluate: Callable[[], dict[str, float]] = dict
    fresh_extra: Callable[[], dict[str, Any]] = dict


@dataclass(frozen=True)
class Callbacks:
    """What the loop tells its caller: each finished step (step, total, train loss: a progress
    bar), each step's point of the training curves (`curve_points`; on resume first those of
    the restored history, so a fresh curve log ends with every step once), and log lines."""

    on_step: Callable[[int, int, float], None] = lambda step, total, loss: None
    on_point: OnPoint = lambda step, values: None
    log: Callable[[str], None] = print


@dataclass(frozen=True)
class ResumeFile:
    """Where the resume state goes, and the fingerprint of the run it belongs to."""

    path: Path
    fingerprint: str


@dataclass
class Unread:
    """A step the device may still be running: its loss and gradient norm on their way to
    the host, and what its history row takes besides them."""

    step: int  # 1-based, as the history counts
    epoch: int  # 1-based
    lr: float
    values: Readback  # [loss, gradient norm]
    stats: dict[str, float]
    tokens: int


@dataclass
class Training:
    """One run of the loop, as its named steps: `restore` (on resume), then for every step
    `train_step`, `settle` (reading a step's numbers: the next step settles it unless the
    loop needs them at once), `end_epoch` (after an epoch's last step), `save` (every
    `save_every`) and `report`.

    The finiteness check waits on the device, and a check after every step would leave the
    GPU idle while the host prepares the next batch. So each update is told to skip itself
    on the device when its loss or gradient norm is not finite (fused AdamW's `found_inf`),
    and the host reads the numbers one step later, after it has queued the next step's
    forward and backward and before that step's update: a non-finite step still raises
    `NonFiniteError` with the weights as they were before it."""

    model: Backbone
    opt: OptimParams
    objective: Objective
    callbacks: Callbacks
    resume: ResumeFile
    device: torch.device
    world: World
    dropout: bool
    held: Holder  # the model as `train.strategy` trains it
    optimizer: torch.optim.Optimizer
    total: int  # steps
    history: History = field(default_factory=History)
    saved: int = 0  # the last step the resume file holds
    unread: Unread | None = None  # the last step, until `settle` reads it

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a saved resume state: weights, optimizer, RNG and history."""
        self.held.load(self.optimizer, state["model"], state["optimizer"])
        set_rng_state(state["rng"])
        self.history.steps, self.history.epochs = state["steps"], state["epochs"]
        self.history.extra = state["extra"]
        self.history.resumed_from = self.saved = state["step"]
        self.callbacks.log(f"resuming from step {self.saved} of {self.total}")
        for point in curve_points(self.history.steps, self.history.epochs):
            self.callbacks.on_point(*point)

    def train_step(self, step: int, epoch: int, batch: list[int]) -> None:
        """One optimizer step on this global `batch` (this rank's share of it), skipped on
        the device if its loss or gradient norm is not finite; the step before is settled
        (and reported) once this one's backward is queued, before this one's update."""
        opt, world = self.opt, self.world
        started = time.perf_counter()
        lr = lr_at(step, opt.lr, opt.warmup_steps, self.total, opt.min_lr_ratio)
        set_lr(self.optimizer, lr)
        rows, holds_rows = world.shard(batch)
        with autocast(self.device, opt.bf16):
            loss, tokens = self.held.loss(self.objective.batch_loss, rows)
        mine = self.objective.units(rows) if holds_rows else 0
        measured = self.objective.step_stats()  # what the batch measured besides its loss
        tokens = tokens if holds_rows else 0
        train_loss, stats, total_units, tokens = global_step(
            world, loss, mine, tokens, measured, self.device
        )
        self.optimizer.zero_grad(set_to_none=True)
        globally_normalized(loss, mine / total_units, world).backward()
        norm = grad_norm(self.model.parameters(), opt.grad_clip)
        if self.unread is not None:
            self.history.seconds += time.perf_counter() - started  # `settle` times its wait
            self.settle()
            self.report()
            started = time.perf_counter()
        values = torch.stack([torch.as_tensor(train_loss, device=norm.device).float(), norm])
        self.optimizer.found_inf = (~values.isfinite().all()).float()  # [] 1.0: skip it
        self.optimizer.step()
        self.unread = Unread(step + 1, epoch + 1, lr, Readback.of(values), stats, tokens)
        self.history.seconds += time.perf_counter() - started

    def settle(self) -> None:
        """Read the last step's loss and gradient norm (waiting on the device for that step,
        not for what was queued after it) and append its row to the history; a non-finite
        one raises `NonFiniteError`, its update skipped on the device."""
        unread, self.unread = self.unread, None
        if unread is None:
            return
        started = time.perf_counter()
        train_loss, norm = unread.values.read()
        try:
            require_finite(unread.step, {"train_loss": train_loss}, unread.stats)
            require_finite(unread.step, {"grad_norm": norm})
        except NonFiniteError as exc:
            if self.saved:
                exc.last_good = f"{self.resume.path} (step {self.saved})"
            raise
        self.history.seconds += time.perf_counter() - started
        self.history.tokens += unread.tokens
        row = {"step": unread.step, "epoch": unread.epoch, "lr": unread.lr}
        self.history.steps.append(row | {"train_loss": train_loss} | unread.stats)

    def end_epoch(self, epoch: int) -> None:
        """The epoch's mean training loss and the evaluation, in eval mode, logged."""
        losses = [r["train_loss"] for r in self.history.steps if r["epoch"] == epoch + 1]
        self.model.eval()
        with torch.no_grad():
            scores = self.held.evaluate(self.objective.evaluate)
        self.model.train(self.dropout)
        row = {"epoch": epoch + 1, "train_loss": sum(losses) / len(losses), **scores}
        self.history.epochs.append(row)
        self.callbacks.log(
            f"epoch {epoch + 1}/{self.opt.epochs}: "
            + ", ".join(f"{k} {v:.4f}" for k, v in row.items() if k != "epoch")
        )

    def save(self, step: int) -> None:
        """The resume state after `step`: gathered on every rank, written by rank 0."""
        model_state, optimizer_state = self.held.state(self.optimizer)
        if self.world.is_main:
            history = {"steps": self.history.steps, "epochs": self.history.epochs}
            state = {"model": model_state, "optimizer": optimizer_state, "rng": rng_state()}
            state |= {"step": step, **history, "extra": self.history.extra}
            checkpoint.save_resume(self.resume.path, self.resume.fingerprint, state)
        self.saved = step

    def report(self) -> None:
        """The last settled step's point of the training curves, and the step itself."""
        step, point = curve_points(self.history.steps[-1:], self.history.epochs)[0]
        self.callbacks.on_point(step, point)
        self.callbacks.on_step(step, self.total, self.history.steps[-1]["train_loss"])


def fit(
    model: Backbone,
    opt: OptimParams,
    objective: Objective,
    *,
    seed: int,
    n_examples: int,
    device: torch.device,
    resume: ResumeFile,
    lengths: Sequence[int] | None = None,
    callbacks: Callbacks = Callbacks(),
    dropout: bool = True,
    world: World = World(),  # noqa: B008 (frozen)
    strategy: str = "ddp",
) -> tuple[History, Backbone]:
    """Train `objective` for `opt.epochs` epochs over `n_examples`, resuming from `resume`
    where it holds this run's state. Returns the history and the trained model, whole:
    `model` itself, or under `strategy` fsdp2 with several processes a plain copy gathered
    from its shards (`model` then stays sharded; use the returned one).

    `lengths` (tokens per example) turns on length-bucketed batches (`batch_order`).
    `dropout` False trains in eval mode: DPO's log-ratios to a reference computed without
    dropout must start at exactly zero, not at the noise dropout adds. A non-finite loss or
    gradient norm raises `NonFiniteError` before its update (`rlhf.train.guard`).
    """
    steps_per_epoch = math.ceil(n_examples / opt.batch_size)
    total = opt.epochs * steps_per_epoch
    state = resume_state(resume.path, resume.fingerprint, world, callbacks.log)
    extra: dict[str, Any] = {}
    if state is None:
        model.eval()
        with torch.no_grad():
            extra = objective.fresh_extra()
    held = hold(model, strategy, world, device, opt.bf16)  # the optimizer takes its parameters
    optimizer = adamw(model, opt.lr, opt.weight_decay, (opt.beta1, opt.beta2))
    run = Training(
        model, opt, objective, callbacks, resume, device, world, dropout, held, optimizer, total
    )
    if state is None:
        run.history.extra = extra
    else:
        run.restore(state)
    model.train(dropout)
    order: list[int] = []
    for step in range(run.history.resumed_from, total):
        epoch, index = divmod(step, steps_per_epoch)
        if index == 0 or not order:
            order = batch_order(n_examples, seed, epoch, lengths, opt.batch_size)
        run.train_step(step, epoch, order[index * opt.batch_size :][: opt.batch_size])
        ends_epoch = index == steps_per_epoch - 1
        saves = (step + 1) % opt.save_every == 0 and step + 1 < total
        if ends_epoch or saves or step + 1 == total:  # needs this step's numbers now
            run.settle()
            if ends_epoch:
                run.end_epoch(epoch)
            if saves:
                run.save(step + 1)
            run.report()
    if report := compile_report():
        callbacks.log(report)
    model.eval()
    return run.history, held.whole_model()
