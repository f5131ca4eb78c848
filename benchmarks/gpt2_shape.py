"""A GPT-2 model folder of any shape with random weights, as a user's pretrained model arrives.

The GPU benchmarks run at GPT-2 124M's shape (12 layers, width 768, 12 heads, vocabulary
50,257, context 1,024) without downloading GPT-2: `transformers` builds the model with random
weights and writes it with `save_pretrained`, beside a byte-level BPE `tokenizer.json` of the
same vocabulary size. The pipeline loads that folder as it loads a real GPT-2
(`rlhf.models.hf.load_folder`, `pretrained_tokenizer`), so the timed code is the code a user's
run executes, and Hugging Face `generate` can run on exactly the same weights.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

END_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class Shape:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    n_positions: int = 1024

    @property
    def end_id(self) -> int:
        """`<|endoftext|>`, the last id as in GPT-2; also the padding, as GPT-2 has none."""
        return self.vocab_size - 1

    def non_embedding_params(self) -> int:
        """nanoGPT's N: every parameter but the position embeddings (the token embedding is
        the tied LM head, so it counts once): 123,653,376 at GPT-2 124M's shape."""
        per_block = 12 * self.n_embd**2 + 13 * self.n_embd  # attention, MLP, two norms
        return self.n_layer * per_block + self.vocab_size * self.n_embd + 2 * self.n_embd

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token by nanoGPT's `estimate_mfu` (PaLM appendix B): 6N for the
        matrix products forward and backward, plus 12·L·H·Q·T for attention."""
        head_dim = self.n_embd // self.n_head
        attention = 12 * self.n_layer * self.n_head * head_dim * seq_len
        return 6 * self.non_embedding_params() + attention


GPT2_SMALL = Shape()
TINY = Shape(n_layer=2, n_head=2, n_embd=64, vocab_size=1024, n_positions=256)
SHAPES = {"gpt2": GPT2_SMALL, "tiny": TINY}
# each GPU benchmark's --shape: tiny for a quick run on a CPU
SHAPE_OPTION = ("--shape", {"default": "gpt2", "choices": sorted(SHAPES)})


def synthetic_bpe(vocab_size: int) -> Tokenizer:
    """A byte-level BPE with exactly `vocab_size` ids, GPT-2's layout: the 256 byte symbols,
    then merges of symbol pairs, then `<|endoftext|>` last. Its merges are arbitrary (no corpus
    is needed to benchmark), but each is a valid BPE merge, so it encodes and decodes as a
    trained one does."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    pairs = itertools.islice(itertools.product(alphabet, repeat=2), vocab_size - 257)
    merges = [(a, b) for a, b in pairs]
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    vocab |= {a + b: len(alphabet) + i for i, (a, b) in enumerate(merges)}
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens([END_TOKEN])
    assert bpe.get_vocab_size() == vocab_size, bpe.get_vocab_size()
    return bpe


def random_gpt2_folder(folder: Path, shape: Shape = GPT2_SMALL, seed: int = 0) -> Path:
    """Write a GPT-2 folder of `shape` with random weights (GPT-2's initialization) and its
    tokenizer into `folder`; returns `folder`."""
    torch.manual_seed(seed)
    end = shape.end_id
    config = transformers.GPT2Config(
        vocab_size=shape.vocab_size, n_positions=shape.n_positions, n_embd=shape.n_embd,
        n_layer=shape.n_layer, n_head=shape.n_head, bos_token_id=end, eos_token_id=end,
    )  # fmt: skip
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    synthetic_bpe(shape.vocab_size).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": END_TOKEN, "pad_token": END_TOKEN})
    )
    return folder
