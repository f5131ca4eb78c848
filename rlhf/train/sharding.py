"""How the data-parallel processes hold a model they train: whole on each (DDP) or sharded
across them (FSDP2, `train.strategy: fsdp2`).

Both run the training losses, and FSDP2 the evaluations too, as the forward of one module
holding the model (`Runs`): DDP prepares its gradient reduction and FSDP2 gathers the
parameters only around a module's forward, and the stages' losses reach into the model
(packed forwards, reward and value heads) rather than calling its forward. Both give the whole
model's state for the resume file, whatever the number of processes, so a run resumes at any.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from rlhf.models.backbone import Backbone
from rlhf.models.lora import same_layout
from rlhf.train.distributed import World, data_parallel

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

# torch.distributed's checkpoint, FSDP and DTensor modules are imported where they are used:
# together they take over a second to import (sympy, DTensor's ops), which every stage's start
# would pay, and a stage that fails early or never saves a resume state needs none of them

Result = TypeVar("Result")


def whole_options(optimizer: bool = False, cpu_offload: bool = False) -> StateDictOptions:
    """`StateDictOptions` for the whole state, in one format (keyed by parameter name)
    whichever way the model is held, so a resume state written by one process loads into
    several, replicated or sharded, and back. A head the stage never trains (SFT's reward
    head) has no optimizer state: the optimizer's is not strict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, strict=not optimizer, cpu_offload=cpu_offload)


class Runs(nn.Module):
    """A module whose forward runs a function, for DDP or FSDP2 to wrap the model in."""

    def __init__(self, model: Backbone) -> None:
        super().__init__()
        self.model = model

    def forward(self, function: Callable[..., Any], *args: Any) -> Any:
        return function(*args)


class Replicas:
    """The whole model in each process; under torchrun DDP averages the gradients."""

    def __init__(self, model: Backbone, world: World) -> None:
        self.model = model
        self.wrapped = data_parallel(Runs(model)) if world.distributed else None

    def loss(self, function: Callable[..., Result], *args: Any) -> Result:
        """`function(*args)`, a loss to backpropagate (with DDP: reduced in backward)."""
        if self.wrapped is None:
            return function(*args)
        return self.wrapped(function, *args)

    def accumulating(self, last: bool) -> contextlib.AbstractContextManager:
        """Where a loss is run and backpropagated whose gradients add to the next ones
        (`last` False) or complete them: DDP reduces them across ranks with the last only."""
        if self.wrapped is None or last:
            return contextlib.nullcontext()
        return self.wrapped.no_sync()

    def evaluate(self, function: Callable[[], Result]) -> Result:
        """`function()`, which runs the model forward only."""
        return function()

    def gathered(self, function: Callable[[], Result]) -> Result:
        """`function()`, many forwards of the whole model (sampling)."""
        return function()

    def state(self, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
        """The model's and the optimizer's state, whole."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        whole = whole_options(optimizer=True)
        return self.model.state_dict(), get_optimizer_state_dict(
            self.model, optimizer, options=whole
        )

    def load(self, optimizer: torch.optim.Optimizer, model_state: dict, optim_state: dict) -> None:
        """Load a whole state (`state`'s, either holder's)."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        self.model.load_state_dict(model_state)
        whole = whole_options(optimizer=True)
        set_optimizer_state_dict(self.model, optimizer, optim_state, options=whole)

    def whole_model(self) -> Backbone:
        """The trained model, whole, for what follows the training."""
        return self.model


class Shards:
    """Parameters, gradients and optimizer state sharded across the processes (FSDP2): each
    transformer block is a unit gathered for its own forward and backward, the rest
    (embeddings, final norm, heads) one unit gathered around each loss and evaluation. On
    CUDA with `bf16` the gathered parameters compute in bfloat16 and gradients are reduced in
    float32. Every rank must run the same forwards: evaluations see the same data on each."""

    def __init__(self, model: Backbone, device: torch.device, bf16: bool) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        blocks, root = MixedPrecisionPolicy(), MixedPrecisionPolicy(cast_forward_inputs=False)
        if bf16 and device.type == "cuda":
            blocks = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            # what the losses are handed (RL's rollout log-probs, advantages, returns) keeps
            # its precision: only the blocks cast their inputs
            root = dataclasses.replace(blocks, cast_forward_inputs=False)
        self.blocks = [fully_shard(b, mp_policy=blocks) for b in model.transformer_blocks()]
        self.model, self.device = model, device
        self.wrapped = fully_shard(Runs(model), mp_policy=root)

    def loss(self, function: Callable[..., Result], *args: Any) -> Result:
        return self.wrapped(function, *args)

    @contextlib.contextmanager
    def accumulating(self, last: bool) -> Iterator[None]:
        """As `Replicas.accumulating`: the gradients are reduce-scattered with the last."""
        self.wrapped.set_requires_gradient_sync(last)
        try:
            yield
        finally:
            self.wrapped.set_requires_gradient_sync(True)

    def evaluate(self, function: Callable[[], Result]) -> Result:
        return self.wrapped(function)

    def gathered(self, function: Callable[[], Result]) -> Result:
        """`function()` with every block gathered once and kept so until it returns: a
        sampling loop's many forwards then run on the whole model without a collective
        each, so ranks that stop decoding at different steps never wait on one another."""
        for block in self.blocks:
            block.set_reshard_after_forward(False)
        try:
            return self.wrapped(function)
        finally:
            for block in self.blocks:
                block.reshard()
                block.set_reshard_after_forward(True)

    def state(self, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
        """The whole model's and optimizer's state, gathered on rank 0's CPU (the other ranks
        get empty dicts; every rank must call it)."""
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = whole_options(cpu_offload=True)
        return (
            get_model_state_dict(self.model, options=options),
            get_optimizer_state_dict(self.model, optimizer, options=options),
        )

    def load(self, optimizer: torch.optim.Optimizer, model_state: dict, optim_state: dict) -> None:
        """Shard a whole state (either holder's `state`, which every rank maps from the
        resume file) into the model and optimizer."""
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        set_model_state_dict(self.model, model_state, options=whole_options())
        whole = whole_options(optimizer=True)
        set_optimizer_state_dict(self.model, optimizer, optim_state, options=whole)

    @torch.no_grad()
    def whole_model(self) -> Backbone:
        """A plain model with the trained weights (and adapters, if it has them), on every
        rank: gathered one tensor at a time into a fresh copy, so the peak is the whole
        model and one tensor beside the shards. What follows training (evaluation, outputs)
        runs it as one process would."""
        from torch.distributed.tensor import DTensor

        whole = same_layout(self.model, self.device)
        targets = whole.state_dict()
        for name, value in self.model.state_dict().items():
            targets[name].copy_(value.full_tensor() if isinstance(value, DTensor) else value)
        return whole.eval()


Holder = Replicas | Shards


def hold(model: Backbone, strategy: str, world: World, device: torch.device, bf16: bool) -> Holder:
    """How this process holds `model` for training under `strategy` (`train.strategy`)."""
    if strategy == "fsdp2" and world.distributed:
        return Shards(model, device, bf16)
    return Replicas(model, world)
