"""Llama-family decoders: Llama-3.x, Qwen2/Qwen2.5 and Qwen3 (dense), as one backbone.

The three differ only in switches: RMSNorm pre-norm blocks, rotary positions (with Llama-3's
long-context frequency scaling), grouped-query attention and a SwiGLU MLP are common; Qwen2
adds biases to the query, key and value projections, Qwen3 an RMSNorm over each head's queries
and keys. Module names follow Hugging Face's, so a checkpoint folder's weights load by name
(`llama/convert.py`, through `rlhf.models.hf.load_folder`), and the numerics follow
transformers' (norms in float32, rotary angles from float32 frequencies) so the logits agree
with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from rlhf.models.attention import Mask, attend
from rlhf.models.backbone import Backbone
from rlhf.models.cache import KVCache


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    block_size: int = 2048  # max_position_embeddings
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 4  # fewer than n_head: grouped-query attention
    n_embd: int = 64
    mlp_width: int = 128  # intermediate_size
    head_dim: int = 0  # 0 means n_embd // n_head; Qwen3 sets it apart from the width
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_original_max_len: int = 0  # > 0: Llama-3 frequency scaling with the three below
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3
    tie_embeddings: bool = False

    @property
    def per_head(self) -> int:
        return self.head_dim or self.n_embd // self.n_head


def rope_frequencies(c: LlamaConfig) -> Tensor:
    """Inverse frequencies [D/2] of the rotary embedding; with Llama-3 scaling, wavelengths
    beyond the original context are stretched by `rope_factor`, the band between smoothly.
    Computed on the CPU whatever the default device: on `meta` (the memory estimate builds the
    model there) its arithmetic would run Python reference kernels, which import
    torch._dynamo, 2 s of CPU."""
    dim = c.per_head
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    inv_freq = 1.0 / c.rope_theta**exponents
    if not c.rope_original_max_len:
        return inv_freq
    low_wavelen = c.rope_original_max_len / c.rope_low_freq_factor
    high_wavelen = c.rope_original_max_len / c.rope_high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / c.rope_factor, inv_freq)
    smooth = (c.rope_original_max_len / wavelen - c.rope_low_freq_factor) / (
        c.rope_high_freq_factor - c.rope_low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig, layer: int):
        super().__init__()
        self.layer, self.n_head, self.n_kv_head = layer, c.n_head, c.n_kv_head
        width = c.per_head
        self.q_proj = nn.Linear(c.n_embd, c.n_head * width, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.n_embd, c.n_kv_head * width, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.n_embd, c.n_kv_head * width, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.n_head * width, c.n_embd, bias=False)
        self.q_norm = RMSNorm(width, c.norm_eps) if c.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(width, c.norm_eps) if c.qk_norm else nn.Identity()

    def forward(
        self, x: Tensor, rotary: tuple[Tensor, Tensor], mask: Mask, cache: KVCache | None
    ) -> Tensor:
        batch, steps, _ = x.shape
        # [B, T, heads * D] -> [B, heads, T, D]
        q = self.q_norm(self.q_proj(x).view(batch, steps, self.n_head, -1)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(batch, steps, self.n_kv_head, -1)).transpose(1, 2)
        v = self.v_proj(x).view(batch, steps, self.n_kv_head, -1).transpose(1, 2)
        cos, sin = rotary  # [B, 1, T, D]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        groups = self.n_head // self.n_kv_head
        if groups > 1:  # each key/value head serves `groups` query heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        y = attend(q, k, v, mask)
        return self.o_proj(y.transpose(1, 2).reshape(batch, steps, -1))


class MLP(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.n_embd, c.mlp_width, bias=False)
        self.up_proj = nn.Linear(c.n_embd, c.mlp_width, bias=False)
        self.down_proj = nn.Linear(c.mlp_width, c.n_embd, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: LlamaConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(c.n_embd, c.norm_eps)
        self.self_attn = Attention(c, layer)
        self.post_attention_layernorm = RMSNorm(c.n_embd, c.norm_eps)
        self.mlp = MLP(c)

    def forward(
        self, x: Tensor, rotary: tuple[Tensor, Tensor], mask: Mask, cache: KVCache | None
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(Backbone):
    name = "llama"
    config_class = LlamaConfig

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.value_head = nn.Linear(config.n_embd, 1)
        self.reward_head = nn.Linear(config.n_embd, 1)
        inv_freq = rope_frequencies(config).to(torch.get_default_device())
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    @property
    def max_seq_len(self) -> int:
        return self.config.block_size

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def layer_activation_floats(self, seq_len: int) -> int:
        """The two norms' outputs, queries, keys and values, the attention output and the
        SwiGLU's four intermediates, plus 2.5 floats per head and position for the attention
        probabilities (as GPT counts them)."""
        c = self.config
        kv = 2 * c.n_kv_head * c.per_head
        per_layer = 4 * c.n_embd + c.n_head * c.per_head + kv + 4 * c.mlp_width
        return per_layer + 5 * c.n_head * seq_len // 2

    def kv_layout(self) -> tuple[int, int, int]:
        return self.config.n_layer, self.config.n_kv_head, self.config.per_head

    def trunk(self, ids: Tensor, positions: Tensor, mask: Mask, cache: KVCache | None) -> Tensor:
        x = self.embed_tokens(ids)
        angles = positions[..., None].float() * self.inv_freq.float()  # [B, T, D/2]
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, T, D]
        rotary = (angles.cos().to(x.dtype), angles.sin().to(x.dtype))
        for layer in self.layers:
            x = self.run_block(layer, x, rotary, mask, cache=cache)
        if cache is not None:
            cache.advance(ids.shape[1])
        return self.norm(x)

    def transformer_blocks(self) -> list[nn.Module]:
        return list(self.layers)
