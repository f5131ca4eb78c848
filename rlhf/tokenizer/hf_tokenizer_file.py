"""The pipeline's own tokenizers written as a Hugging Face `tokenizer.json`, for exports.

A byte-level BPE in tiktoken's terms is ranks (byte string -> id, lower merges first), a
pre-tokenizer regex and special tokens. The fast-tokenizer format spells each byte as GPT-2's
printable character and lists merges explicitly; a token's merge is the pair of tokens that
tiktoken's own algorithm joins last when it encodes that token's bytes with only the
lower-ranked tokens available. `hf_vocab.py` reads such a file back, exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import tiktoken

from rlhf.tokenizer.hf_vocab import BYTE_OF


def _last_merge(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts byte-pair encoding joins into `token`, with only lower ranks allowed."""
    limit = ranks[token]
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best = min((ranks.get(parts[i] + parts[i + 1], limit), i) for i in range(len(parts) - 1))
        if best[0] >= limit:
            break
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} is not reachable by merging lower-ranked tokens")
    return parts[0], parts[1]


def tokenizer_json(encoding: tiktoken.Encoding) -> dict:
    """The fast-tokenizer description of a byte-level BPE encoding and its special tokens."""
    char_of = {byte: char for char, byte in BYTE_OF.items()}

    def spell(token: bytes) -> str:
        return "".join(char_of[b] for b in token)

    ranks = encoding._mergeable_ranks
    merges = [
        [spell(a), spell(b)]
        for token, _ in sorted(ranks.items(), key=lambda item: item[1])
        if len(token) > 1
        for a, b in [_last_merge(token, ranks)]
    ]
    added = [
        {"id": id_, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for text, id_ in sorted(encoding._special_tokens.items(), key=lambda item: item[1])
    ]  # fmt: skip
    split = {"type": "Split", "pattern": {"Regex": encoding._pat_str}, "behavior": "Isolated",
             "invert": False}  # fmt: skip
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split,
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False},
        ]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {spell(token): rank for token, rank in ranks.items()},
            "merges": merges,
        },
    }  # fmt: skip


def write_tokenizer_json(encoding: tiktoken.Encoding, path: Path) -> None:
    path.write_text(json.dumps(tokenizer_json(encoding), ensure_ascii=False) + "\n")
