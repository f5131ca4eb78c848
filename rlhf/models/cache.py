"""The KV cache for incremental decoding over left-padded batches.

Left padding puts every prompt's last token in the same column, so one forward per step serves
the whole batch and each row's cache grows by one token. The cache also keeps which cached
columns are real tokens, from which each step's attention mask and positions follow.

The prompt goes in as one forward of any length (the prefill), and eager decoding goes on the
same way, one token at a time over the columns written so far. For compiled decoding,
`start_decoding` switches the cache to a column held on the device: each forward then adds one
token per row there and attends over the whole preallocated buffer (the columns not yet written
are masked), so every step has the same shapes and no Python number that changes; it compiles
once and replays as a CUDA graph.
"""

from __future__ import annotations

import torch
from torch import Tensor


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

    Buffers [B, heads, max_len, head_dim] are allocated once on the first update (no
    concatenation per step), in the dtype the layers produce (bf16 under autocast).
    """

    def __init__(
        self,
        *,
        n_layer: int,
        n_head: int,
        head_dim: int,
        batch_size: int,
        max_len: int,
        device: torch.device,
    ):
        self.shape = (batch_size, n_head, max_len, head_dim)
        self.n_layer = n_layer
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.key_mask = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.length = 0  # tokens cached, while prefilling
        self.column: Tensor | None = None  # [1] where the next token goes, once decoding
        self.decoding = False

    def start_decoding(self) -> None:
        """From here on each forward adds one token per row, at `column` on the device (the
        same tensor for every generation over this cache: a captured graph reads it)."""
        if self.column is None:
            self.column = torch.zeros(1, dtype=torch.long, device=self.key_mask.device)
        self.column.fill_(self.length)
        self.decoding = True

    def reset(self) -> None:
        """Empty, for the next prompt's prefill, in place: the buffers stay where they are
        and the columns not written again are masked."""
        self.key_mask.zero_()
        self.length = 0
        self.decoding = False

    def prepare(self, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Record the new tokens' padding [B, T]; return their attention mask and positions."""
        if self.decoding:
            return self._prepare_step(attention_mask)
        end = self.length + attention_mask.shape[1]
        if end > self.shape[2]:
            raise ValueError(f"KV cache holds {self.shape[2]} tokens; {end} requested")
        self.key_mask[:, self.length : end] = attention_mask
        return attention_mask_and_positions(self.key_mask[:, :end], self.length)

    def _prepare_step(self, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """`prepare` for one decoding step's token per row (padding [B, 1]) at `column`: the
        mask [B, 1, 1, L] over the whole buffer and the positions [B, 1] that
        `attention_mask_and_positions` gives over the columns written so far."""
        assert self.column is not None
        self.key_mask.index_copy_(1, self.column, attention_mask)
        columns = torch.arange(self.shape[2], device=self.key_mask.device)
        allowed = self.key_mask | (columns == self.column)  # [B, L]; a query sees itself
        positions = (self.key_mask.sum(-1, keepdim=True) - 1).clamp(min=0)  # [B, 1]
        return allowed[:, None, None, :], positions

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v [B, H, T, D] at the current offset; return all keys and values so far
        (once decoding, the whole buffer: the columns not yet written are masked)."""
        if not self.keys:
            self.keys = [k.new_zeros(self.shape) for _ in range(self.n_layer)]
            self.values = [v.new_zeros(self.shape) for _ in range(self.n_layer)]
        if self.decoding:
            self.keys[layer].index_copy_(2, self.column, k)
            self.values[layer].index_copy_(2, self.column, v)
            return self.keys[layer], self.values[layer]
        end = self.length + k.shape[2]
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, steps: int) -> None:
        if self.decoding:
            self.column.add_(steps)
        else:
            self.length += steps


def input_mask_and_positions(
    ids: Tensor, attention_mask: Tensor | None, cache: KVCache | None, max_len: int
) -> tuple[Tensor | None, Tensor]:
    """Attention mask (None: the fast causal path) and positions for a forward over ids
    [B, T]: without padding or a cache, plain causal attention and positions 0..T-1; else
    what the padding (and the tokens already cached) allow."""
    if cache is None and ids.shape[1] > max_len:
        raise ValueError(f"{ids.shape[1]} tokens exceed block_size={max_len}")
    if cache is None and attention_mask is None:
        return None, torch.arange(ids.shape[1], device=ids.device)[None]
    if attention_mask is None:
        attention_mask = torch.ones_like(ids, dtype=torch.bool)
    attention_mask = attention_mask.bool()
    if cache is None:
        return attention_mask_and_positions(attention_mask, start=0)
    return cache.prepare(attention_mask)
