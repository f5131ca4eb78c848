"""A decoder-only GPT with the three heads RLHF needs.

nanoGPT's layout (pre-LayerNorm blocks, learned positions, tied embeddings), plus what RLHF adds:
left-padded batches (prompts of different lengths generate together, so every row's last prompt
token sits in the same column), a KV cache for incremental decoding, and value and reward heads
beside the LM head so one trunk serves as policy, critic or reward model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


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

    @property
    def mlp_hidden(self) -> int:
        return self.mlp_width or 4 * self.n_embd


def attention_mask_and_positions(key_mask: Tensor, start: int) -> tuple[Tensor, Tensor]:
    """Attention mask and position ids for the last T = L - start tokens of `key_mask` [B, L].

    Positions count real tokens only, so a left-padded row gets the same positions as the row
    alone. Each query also sees itself: a pad query would otherwise see no key at all and
    scaled_dot_product_attention would return NaN for it.
    Returns mask [B, 1, T, L] (True = attend) and positions [B, T].
    """
    length = key_mask.shape[1]
    steps = length - start
    positions = (key_mask.long().cumsum(-1) - 1).clamp(min=0)[:, start:]
    causal = torch.ones(steps, length, dtype=torch.bool, device=key_mask.device)
    causal = causal.tril(diagonal=start)
    allowed = causal[None] & key_mask[:, None, :]
    diagonal = torch.arange(steps, device=key_mask.device)
    allowed[:, diagonal, diagonal + start] = True
    return allowed[:, None], positions


class KVCache:
    """Keys and values of all layers for the tokens decoded so far.

    Buffers are allocated once for `max_len` tokens (no concatenation per step) on the first
    update, in the dtype the layers produce (bf16 under autocast).
    """

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int, device: torch.device):
        if max_len > config.block_size:
            raise ValueError(f"KV cache of {max_len} tokens exceeds block_size={config.block_size}")
        self.shape = (batch_size, config.n_head, max_len, config.n_embd // config.n_head)
        self.n_layer = config.n_layer
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.key_mask = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.length = 0

    def prepare(self, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Record the new tokens' padding [B, T]; return their attention mask and positions."""
        end = self.length + attention_mask.shape[1]
        if end > self.shape[2]:
            raise ValueError(f"KV cache holds {self.shape[2]} tokens; {end} requested")
        self.key_mask[:, self.length : end] = attention_mask
        return attention_mask_and_positions(self.key_mask[:, :end], self.length)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v [B, H, T, D] at the current offset; return all keys and values so far."""
        if not self.keys:
            self.keys = [k.new_zeros(self.shape) for _ in range(self.n_layer)]
            self.values = [v.new_zeros(self.shape) for _ in range(self.n_layer)]
        end = self.length + k.shape[2]
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, steps: int) -> None:
        self.length += steps


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, mask: Tensor | None, cache: KVCache | None) -> Tensor:
        batch, steps, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        # [B, T, C] -> [B, H, T, D]
        q, k, v = (t.view(batch, steps, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=mask is None,
        )
        y = y.transpose(1, 2).contiguous().view(batch, steps, width)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, mask: Tensor | None, cache: KVCache | None) -> Tensor:
        x = x + self.attn(self.ln_1(x), mask, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
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

    def num_params(self) -> int:
        """Parameters excluding position embeddings, as nanoGPT counts them."""
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()

    def hidden(
        self,
        idx: Tensor,
        attention_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Final hidden states [B, T, C] for tokens idx [B, T].

        attention_mask [B, T] marks real tokens (False = padding); None means no padding, which
        takes the fast is_causal path. With a cache, idx holds only the new tokens.
        """
        if cache is None and idx.shape[1] > self.config.block_size:
            raise ValueError(f"{idx.shape[1]} tokens exceed block_size={self.config.block_size}")
        if cache is None and attention_mask is None:
            mask = None
            positions = torch.arange(idx.shape[1], device=idx.device)[None]
        else:
            if attention_mask is None:
                attention_mask = torch.ones_like(idx, dtype=torch.bool)
            attention_mask = attention_mask.bool()
            if cache is None:
                mask, positions = attention_mask_and_positions(attention_mask, start=0)
            else:
                mask, positions = cache.prepare(attention_mask)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.blocks:
            x = block(x, mask, cache)
        if cache is not None:
            cache.advance(idx.shape[1])
        return self.ln_f(x)

    def forward(
        self,
        idx: Tensor,
        attention_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Next-token logits [B, T, V]."""
        return self.lm_head(self.hidden(idx, attention_mask, cache))

    def values(self, hidden: Tensor) -> Tensor:
        """Per-token value estimates [B, T] from hidden states [B, T, C]."""
        return self.value_head(hidden).squeeze(-1)

    def rewards(self, hidden: Tensor) -> Tensor:
        """Per-token scalar reward [B, T]; the reward model pools it over the response."""
        return self.reward_head(hidden).squeeze(-1)
