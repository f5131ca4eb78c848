"""Memory preflight: refuse a run the device cannot hold before allocating it.

A model or batch too large for the machine otherwise ends with the kernel's OOM killer (no
message, sometimes a frozen host) or a CUDA out-of-memory error deep in a step. The estimate
needs no allocation and takes constant time whatever the model's depth: the backbone is built
on the `meta` device (shapes only) with one and with two blocks, and every count, linear in
the number of blocks, is extrapolated to the configured depth. It is an estimate, deliberately
on the high side of what training takes in fp32 with AdamW; `benchmarks/pretrained.py` sets
it beside measured peaks.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlhf.errors import ResourceError
from rlhf.models.backbone import Backbone
from rlhf.models.registry import build_on_meta

TRAINED_BYTES_PER_PARAM = 16  # fp32 weight, gradient and AdamW's two moments
FROZEN_BYTES_PER_PARAM = 4  # fp32 weight only (a reference policy)
FROZEN_BF16_BYTES_PER_PARAM = 2  # the same in bfloat16 (`memory.frozen_bf16`)
FLOAT_BYTES = 4
GIB = 2**30
# [V, C] float32 gradients of the LM head beside the parameter's own, counted for every trained
# model (on the high side for those trained without the LM loss: reward models, critics): the
# chunked loss's (`rlhf.algorithms.lm_loss`) accumulated one and a chunk's own while it is added
# in, and in the backward of a head tied to the embedding, the embedding's while the two are
# summed; measured: about one beyond the other terms (benchmarks/pretrained.py)
HEAD_GRADIENT_COPIES = 3
# floats per vocabulary entry one sampled row holds in a decoding step (`rlhf.sampling`): its
# logits in float32, scaled by the temperature, log-probs, probs and their running sum (5);
# the top-p nucleus's mass ahead of each of its 8 draws, a difference and a product [8, V]
# each (16); its sort's probs, int64 ids and renormalized probs (4)
SAMPLING_VOCAB_FLOATS = 25
# what no term counts: the allocator's fragmentation and passing temporaries (a prefill's
# block at a time); sampling measured up to 4% above the terms (benchmarks/pretrained.py)
MARGIN = 1.1


@dataclasses.dataclass(frozen=True)
class Workload:
    """What a stage holds at once: models by role, and the sequences (each counted at the
    model's full context) of its largest training step and of its sampling batch."""

    trained: int = 1  # models with gradients and optimizer state
    frozen: int = 0  # models held for inference only
    adapted: int = 0  # models whose fp32 weights stay frozen under trained LoRA adapters
    sequences: int = 0  # sequences of one training step (forward and backward)
    sampled: int = 0  # sequences sampled at once, each with a KV cache
    checkpointed: bool = False  # activation checkpointing in the trained models
    frozen_bf16: bool = False  # frozen models held in bfloat16
    sharded_over: int = 1  # processes the trained models' state is sharded across (fsdp2)


def estimate_bytes(backbone: str, config: dict[str, Any], work: Workload) -> int:
    """Bytes `work` holds at once with this model: weights and optimizer state by role,
    activations, LM-head gradients, KV cache and sampling, and MARGIN over their sum."""
    model = Extrapolated.of(backbone, config, work.checkpointed)
    params = model.count(lambda m: sum(p.numel() for p in m.parameters()))
    frozen = FROZEN_BF16_BYTES_PER_PARAM if work.frozen_bf16 else FROZEN_BYTES_PER_PARAM
    trained = TRAINED_BYTES_PER_PARAM * work.trained
    if work.sharded_over > 1 and work.trained:
        # each process keeps its share, and gathers one whole fp32 copy at a time (for
        # sampling, the evaluation, the outputs)
        trained = trained / work.sharded_over + FROZEN_BYTES_PER_PARAM
    weights = round(
        params * (trained + frozen * work.frozen + FROZEN_BYTES_PER_PARAM * work.adapted)
    )
    seq_len = model.one_block.max_seq_len
    vocab, width = model.one_block.config.vocab_size, model.one_block.config.n_embd
    activations = work.sequences * seq_len * model.count(lambda m: m.activation_floats(seq_len))
    head_gradients = work.trained * HEAD_GRADIENT_COPIES * vocab * width
    cache = work.sampled * seq_len * model.count(lambda m: m.cache_floats())
    sampling = work.sampled * SAMPLING_VOCAB_FLOATS * vocab
    return round(
        MARGIN * (weights + FLOAT_BYTES * (activations + head_gradients + cache + sampling))
    )


@dataclasses.dataclass(frozen=True)
class Extrapolated:
    """A model's counts at its configured depth, from its one-block and two-block versions
    on `meta`: every count the estimate takes is linear in the number of blocks."""

    one_block: Backbone
    two_blocks: Backbone
    layers: int

    @classmethod
    def of(cls, backbone: str, config: dict[str, Any], checkpointed: bool) -> Extrapolated:
        shallow = []
        for layers in (1, 2):
            model = build_on_meta(backbone, {**config, "n_layer": layers})
            model.activation_checkpointing = checkpointed
            shallow.append(model)
        default = {f.name: f.default for f in dataclasses.fields(shallow[0].config_class)}
        return cls(*shallow, layers={**default, **config}["n_layer"])

    def count(self, of: Callable[[Backbone], int]) -> int:
        one, two = of(self.one_block), of(self.two_blocks)
        return one + (self.layers - 1) * (two - one)


def available_bytes(device: torch.device) -> int:
    """Free memory on a CUDA device; on the CPU, what the kernel reports as available."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def preflight(
    what: str, backbone: str, config: dict[str, Any], work: Workload, device: torch.device
) -> int:
    """Raise ResourceError when `work` with this model would not fit on `device`; returns
    the estimate in bytes."""
    need, have = estimate_bytes(backbone, config, work), available_bytes(device)
    if need > have:
        raise ResourceError(
            f"{what} needs about {need / GIB:.1f} GiB ({_describe(config)}), but {device} has "
            f"{have / GIB:.1f} GiB available; use a smaller model or smaller batches"
        )
    return need


def _describe(config: dict[str, Any]) -> str:
    keys = ("n_layer", "n_embd", "n_head", "block_size", "vocab_size")
    return ", ".join(f"{k} {config[k]}" for k in keys if k in config)
