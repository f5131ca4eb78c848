"""A decoder-only GPT, the backbone the embedded default trains from scratch.

nanoGPT's layout (pre-LayerNorm blocks, learned positions, tied embeddings), plus what RLHF adds:
left-padded batches (prompts of different lengths generate together), a KV cache for
incremental decoding, and value and reward heads beside the LM head so one trunk serves as
policy, critic or reward model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from rlhf.models.attention import Mask, attend
from rlhf.models.backbone import Backbone
from rlhf.models.cache import KVCache


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int = 96
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    mlp_width: int = 0  # hidden units of each MLP; 0 means GPT-2's 4 * n_embd
    gelu: str = "none"  # "tanh": the approximation GPT-2 was trained with (its "gelu_new")

    @property
    def mlp_hidden(self) -> int:
        return self.mlp_width or 4 * self.n_embd


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, mask: Mask, cache: KVCache | None) -> Tensor:
        batch, steps, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        # [B, T, C] -> [B, H, T, D]
        q, k, v = (t.view(batch, steps, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        y = attend(q, k, v, mask, self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(batch, steps, width)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.gelu = config.gelu

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=self.gelu)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, mask: Mask, cache: KVCache | None) -> Tensor:
        x = x + self.attn(self.ln_1(x), mask, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(Backbone):
    name = "gpt"
    config_class = GPTConfig

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.value_head = nn.Linear(config.n_embd, 1)
        self.reward_head = nn.Linear(config.n_embd, 1)

        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of residual projections
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def max_seq_len(self) -> int:
        return self.config.block_size

    def num_params(self) -> int:
        """Parameters excluding position embeddings, as nanoGPT counts them."""
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()

    def layer_activation_floats(self, seq_len: int) -> int:
        """Korthikanti et al. (2022): 34 bytes per width unit and 5 per head and position at
        two bytes a value, i.e. 17 and 2.5 floats."""
        c = self.config
        return 17 * c.n_embd + 5 * c.n_head * seq_len // 2

    def kv_layout(self) -> tuple[int, int, int]:
        c = self.config
        return c.n_layer, c.n_head, c.n_embd // c.n_head

    def trunk(self, ids: Tensor, positions: Tensor, mask: Mask, cache: KVCache | None) -> Tensor:
        x = self.drop(self.wte(ids) + self.wpe(positions))
        for block in self.blocks:
            x = self.run_block(block, x, mask, cache=cache)
        if cache is not None:
            cache.advance(ids.shape[1])
        return self.ln_f(x)

    def transformer_blocks(self) -> list[nn.Module]:
        return list(self.blocks)
