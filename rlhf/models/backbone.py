"""What every backbone offers the rest of the library, whatever its architecture.

A policy, a critic and a reward model are the same transformer trunk read three ways: next-token
logits from the LM head, a per-token value from the value head, a per-token reward from the
reward head. Sampling, RL, the reward model and DPO use only the methods below, so a new
architecture (GPT-2, Llama, Qwen) is a subclass in a family folder plus a registry entry, never
a change to them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from rlhf.models import packing
from rlhf.models.attention import Mask, runs_varlen
from rlhf.models.cache import KVCache, input_mask_and_positions

# On CUDA the LM head's matmuls run at a vocabulary padded with zero rows to a multiple of this
# (GPT-2's 50,257 to 50,304, as nanoGPT and llm.c pad it): the head is about a quarter of a
# small model's FLOPs, and an unaligned vocabulary keeps its three matmuls off the tensor
# cores' aligned kernels. Only the matmuls see the padding: the parameters, their optimizer
# state, checkpoints and exports keep the real vocabulary, and no padded logit reaches a
# softmax (sliced off the logits, or -inf in the chunked loss). A matmul of fewer rows than
# PADDED_ROWS (a decoding step's) is bound by reading the weight, which padding would copy.
VOCAB_MULTIPLE = 64
PADDED_ROWS = 512


class Backbone(nn.Module, ABC):
    """A decoder-only transformer with an LM head, `lm_head` (`nn.Linear(hidden, vocab)`
    without bias), and two scalar heads, `value_head` and `reward_head` (each
    `nn.Linear(hidden, 1)`); subclasses create all three."""

    name: ClassVar[str]  # registry key, stored in checkpoints
    config_class: ClassVar[type]  # a dataclass: the architecture, rebuilt from checkpoints
    config: Any
    lm_head: nn.Linear
    value_head: nn.Linear
    reward_head: nn.Linear
    # recompute each block in the backward pass instead of keeping its activations
    activation_checkpointing: bool = False
    # each block compiled (`compile_blocks`) for the forwards without a KV cache
    compiled_blocks: dict[int, nn.Module] | None = None
    # what the LM head's matmuls pad the vocabulary to a multiple of; None: VOCAB_MULTIPLE
    # where the head lives on CUDA, none elsewhere (CPU numbers stay as they are)
    vocab_multiple: int | None = None

    @property
    @abstractmethod
    def max_seq_len(self) -> int:
        """Most tokens one sequence (prompt and response) may hold."""

    @abstractmethod
    def trunk(self, ids: Tensor, positions: Tensor, mask: Mask, cache: KVCache | None) -> Tensor:
        """Final hidden states [B, T, C] of token ids [B, T] at `positions` [B, T] under the
        attention `mask` [B, 1, T, L] (True = attend; None = plain causal attention, the fast
        path; `Segments`: one packed stream, B = 1, causal within each segment); with a cache,
        ids holds only the tokens after those already cached, and the cache advances past
        them. The one method an architecture implements for its forward."""

    def hidden_states(
        self, ids: Tensor, attention_mask: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        """Final hidden states [B, T, C] for token ids [B, T].

        attention_mask [B, T] marks real tokens (False = padding); None means no padding. With
        a cache, ids holds only the tokens after those already cached.
        """
        mask, positions = input_mask_and_positions(ids, attention_mask, cache, self.max_seq_len)
        return self.trunk(ids, positions, mask, cache)

    def packed_hidden_states(self, packed: packing.Packing) -> Tensor:
        """Final hidden states [S, L, C] of rows packed back to back in bins [S, L]
        (`rlhf.models.packing`): a token attends only to the earlier tokens of its own
        row, and positions restart at 0 with each row. The bins run as one stream through
        varlen attention where `runs_varlen` says so, else each under its block-diagonal
        mask."""
        ids, segments = packed.ids, packed.segments  # [S, L]
        positions = packing.positions(segments)
        dropout = getattr(self.config, "dropout", 0.0) if self.training else 0.0
        head_dim = self.kv_layout()[2]
        if runs_varlen(ids.device, self.lm_head.weight.dtype, dropout, head_dim):
            flat_ids, flat_positions = ids.view(1, -1), positions.view(1, -1)  # [1, S*L]
            stream = self.trunk(flat_ids, flat_positions, packed.runs, None)  # [1, S*L, C]
            return stream.view(*ids.shape, -1)
        return self.trunk(ids, positions, packing.bin_mask(segments), None)

    @abstractmethod
    def transformer_blocks(self) -> list[nn.Module]:
        """The repeated blocks of the trunk, in order: the units a sharded model gathers one
        at a time (`rlhf.train.sharding`)."""

    def compile_blocks(self) -> None:
        """Compile each transformer block (`torch.compile`, shapes marked dynamic as they
        vary) for every forward without a KV cache: the training losses and the scoring
        passes, whose packed bins change shape from batch to batch. One block at a time, as
        torchtitan does, so a sharded block keeps its FSDP2 hooks around its compiled body.
        Decoding compiles its step whole instead (`rlhf.sampling.generate`)."""
        self.compiled_blocks = {id(b): torch.compile(b) for b in self.transformer_blocks()}

    def run_block(
        self, block: nn.Module, x: Tensor, *args: object, cache: KVCache | None
    ) -> Tensor:
        """One transformer block, compiled where `compile_blocks` compiled it and no cache is
        used; checkpointed when activation checkpointing is on and a backward pass will
        follow: its activations are then recomputed, not kept."""
        if cache is None and self.compiled_blocks is not None:
            block = self.compiled_blocks[id(block)]
        if self.activation_checkpointing and torch.is_grad_enabled():
            return checkpoint(block, x, *args, cache, use_reentrant=False)
        return block(x, *args, cache)

    def head_weight(self, rows: int) -> tuple[Tensor, int]:
        """The LM head's weight as a matmul of `rows` hidden states takes it, [V', C]: padded
        with zero rows to a multiple of `vocab_multiple` for PADDED_ROWS rows or more (a
        differentiable copy: the gradient reaches the parameter, [V, C]), and V, the
        vocabulary whose logits are real."""
        weight = self.lm_head.weight  # [V, C]
        multiple = self.vocab_multiple or (VOCAB_MULTIPLE if weight.is_cuda else 1)
        extra = -weight.shape[0] % multiple if rows >= PADDED_ROWS else 0
        return (F.pad(weight, (0, 0, 0, extra)) if extra else weight), weight.shape[0]

    def lm_logits(self, hidden: Tensor) -> Tensor:
        """Next-token logits [B, T, V] from hidden states [B, T, C] (the matmul at the padded
        vocabulary, its padding sliced off)."""
        weight, vocab = self.head_weight(hidden.numel() // hidden.shape[-1])
        logits = F.linear(hidden, weight)  # [B, T, V']
        return logits[..., :vocab] if weight.shape[0] > vocab else logits

    @abstractmethod
    def kv_layout(self) -> tuple[int, int, int]:
        """What one token's KV cache holds: (layers, key/value heads, head dim)."""

    @abstractmethod
    def num_params(self) -> int:
        """Parameters that count toward the model's size, as its family reports it."""

    @abstractmethod
    def layer_activation_floats(self, seq_len: int) -> int:
        """Floats one token of a training sequence of `seq_len` tokens keeps in one block for
        the backward pass."""

    def activation_floats(self, seq_len: int) -> int:
        """Floats one token keeps for the backward pass, logits and their gradient included:
        what the memory preflight multiplies by the tokens per step. Checkpointed, a block
        keeps only its input, and one block at a time holds the rest while it is recomputed."""
        layers, width = self.kv_layout()[0], self.config.n_embd
        per_layer = self.layer_activation_floats(seq_len)
        if self.activation_checkpointing:
            return layers * width + per_layer + 3 * self.config.vocab_size
        return layers * per_layer + 3 * self.config.vocab_size

    def cache_floats(self) -> int:
        """Floats one cached token takes in the KV cache during sampling."""
        layers, heads, head_dim = self.kv_layout()
        return 2 * layers * heads * head_dim

    def new_cache(self, batch_size: int, max_len: int, device: torch.device) -> KVCache:
        """An empty KV cache for decoding up to `max_len` tokens per row."""
        if max_len > self.max_seq_len:
            raise ValueError(f"KV cache of {max_len} tokens exceeds block_size={self.max_seq_len}")
        layers, heads, head_dim = self.kv_layout()
        return KVCache(
            n_layer=layers,
            n_head=heads,
            head_dim=head_dim,
            batch_size=batch_size,
            max_len=max_len,
            device=device,
        )

    def forward(
        self,
        ids: Tensor,
        attention_mask: Tensor | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """Next-token logits [B, T, V]; `last_only`, those of the last position [B, 1, V]: a
        prefill samples from that position alone, and [B, T, V] logits of a long prompt over
        a large vocabulary (64 x 512 x 151,936 in bfloat16: 10 GB) would be its peak."""
        hidden = self.hidden_states(ids, attention_mask, cache)  # [B, T, C]
        return self.lm_logits(hidden[:, -1:] if last_only else hidden)

    def values(self, hidden: Tensor) -> Tensor:
        """Per-token value estimates [B, T] from hidden states [B, T, C]."""
        return self.value_head(hidden).squeeze(-1)

    def rewards(self, hidden: Tensor) -> Tensor:
        """Per-token scalar reward [B, T]; the reward model pools it over the response."""
        return self.reward_head(hidden).squeeze(-1)

    def optimizer_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """AdamW groups: decay on matrices and embeddings only; decaying biases and norms only
        hurts."""
        params = [p for p in self.parameters() if p.requires_grad]
        return [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]

    @torch.no_grad()
    def init_value_head_from_reward_head(self) -> None:
        """Copy the reward head into the value head: a critic made from a reward model then
        predicts roughly what the episode will score from its first update."""
        self.value_head.weight.copy_(self.reward_head.weight)
        self.value_head.bias.copy_(self.reward_head.bias)

    @torch.no_grad()
    def shift_rewards(self, offset: float) -> None:
        """Subtract `offset` from every reward this model gives."""
        self.reward_head.bias -= offset


def freeze(model: Backbone, bf16: bool = False) -> Backbone:
    """`model` for inference only: no gradients (so no optimizer state and no autograd
    graph), eval mode, and bfloat16 weights when `bf16`."""
    model.requires_grad_(False).eval()
    return model.to(torch.bfloat16) if bf16 else model
