"""The skeleton every model stage shares, written once: params, seed, device, tokenizer,
loading checkpoints and building the payload of a new one (`fitting.py` adds the training loop).

A stage's resume fingerprint covers exactly what DVC keys the stage by (its params groups,
its inputs and the code it imports, all from its SPEC), so an
interrupted run resumes only into the run it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlhf.cpu import pin_kernels
from rlhf.models import checkpoint
from rlhf.models.backbone import Backbone, freeze
from rlhf.params import Params
from rlhf.params.schema import group_hash
from rlhf.project import paths
from rlhf.project.imports import code_closure
from rlhf.project.specs import StageSpec
from rlhf.stages.support.common import console, file_digest, params
from rlhf.stages.support.outputs import begin
from rlhf.tokenizer.tokenizer import Tokenizer, load_tokenizer
from rlhf.train.device import pin_threads, resolve_device
from rlhf.train.distributed import World, current_world, join
from rlhf.train.memory import Workload, preflight


@dataclass
class StageRun:
    spec: StageSpec
    params: Params
    device: torch.device
    tokenizer: Tokenizer
    world: World  # this process's rank among the stage's data-parallel workers

    @classmethod
    def start(cls, declared: StageSpec, item: str | None = None) -> StageRun:
        """Clear what a killed run left half-written, load and check params, pin the CPU
        kernels and torch's CPU threads (before the stage's first tensor operation), seed
        torch, pick the device, join the data-parallel workers (under torchrun), load the
        tokenizer; `item` is the element of a foreach stage (the RL algorithm)."""
        spec, world = declared.filled(item), current_world()
        if world.is_main:
            begin(spec)
        p = params()
        pin_kernels(p.cpu_kernels)
        pin_threads(p.threads)
        torch.manual_seed(p.seed)
        device = join(world, resolve_device(p.device))
        return cls(spec, p, device, load_tokenizer(paths.TOKENIZER), world)

    @property
    def params_hash(self) -> str:
        return group_hash(self.params, *self.spec.params)

    def fingerprint(self) -> str:
        """Params groups, inputs and code, paths relative to the repository root (the
        working directory of every stage)."""
        code = code_closure(self.spec.module)
        return self.params_hash + file_digest(*self.spec.inputs) + file_digest(*code)

    def log(self, text: str) -> None:
        """A line of the stage's log, from rank 0 only."""
        if self.world.is_main:
            console.print(f"{self.spec.address}: {text}")

    def workload(self, **counts: int) -> Workload:
        """A `Workload` of these counts under this run's memory options, and for a training
        stage (one keyed by the `train` group) its sharding across the processes."""
        memory = self.params.memory
        sharded = "train" in self.spec.params and self.params.train.strategy == "fsdp2"
        return Workload(
            **counts,
            checkpointed=memory.activation_checkpointing,
            frozen_bf16=self.frozen_bf16,
            sharded_over=self.world.size if sharded else 1,
        )

    @property
    def frozen_bf16(self) -> bool:
        """Whether models held for inference only are kept in bfloat16 (on CUDA only)."""
        return self.params.memory.frozen_bf16 and self.device.type == "cuda"

    @property
    def compiles(self) -> bool:
        """Whether this stage compiles its models' training and scoring forwards
        (`train.compile`; only the stages keyed by the `train` group, never sharded)."""
        if "train" not in self.spec.params:
            return False
        train = self.params.train
        if train.strategy == "fsdp2" and self.world.distributed:
            return False
        return train.compile == "on" or (train.compile == "auto" and self.device.type == "cuda")

    def compiled(self, model: Backbone) -> Backbone:
        """`model`, its blocks compiled where this stage compiles (`compiles`)."""
        if self.compiles:
            model.compile_blocks()
        return model

    def trainable(self, model: Backbone) -> Backbone:
        """`model` on this run's device, checkpointing activations if the params say so, and
        compiled where the stage compiles."""
        model.activation_checkpointing = self.params.memory.activation_checkpointing
        return self.compiled(model.to(self.device))

    def preflight(self, model_file: Path, work: Workload) -> None:
        """Refuse, before loading anything, a workload with the model in `model_file` that
        the device cannot hold."""
        backbone, config = checkpoint.model_config(model_file)
        preflight(self.spec.address, backbone, config, work, self.device)

    def load_model(self, path: Path) -> Backbone:
        """A model this run trains."""
        return self.trainable(checkpoint.load_model(path, self.tokenizer, self.device)[0])

    def load_frozen(self, path: Path) -> Backbone:
        """A model this run only runs forward: no gradients, eval mode, and in bfloat16 on
        CUDA under `memory.frozen_bf16`."""
        model = checkpoint.load_model(path, self.tokenizer, self.device)[0]
        return self.compiled(freeze(model, self.frozen_bf16))

    def payload(self, model: Backbone, kind: str, **extra: Any) -> dict[str, Any]:
        return checkpoint.model_payload(model, self.tokenizer, self.params_hash, kind, **extra)
