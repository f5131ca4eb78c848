"""Tokenizers for the pipeline, all encoded by tiktoken.

Three kinds share one on-disk form (`tokenizer.json` plus, for trained or byte vocabularies, a
rank file in tiktoken's own `.tiktoken` format) and one identity hash. Checkpoints record that
identity so a model is never decoded with a tokenizer it was not trained with. The special
tokens live here; how they frame a conversation is the chat template's business (`chat.py`).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe

from rlhf.atomic import publication
from rlhf.data.bpe import train_bpe
from rlhf.errors import CheckpointError, OutputError

# GPT-2's pre-tokenization pattern, as tiktoken ships it for r50k/gpt2.
PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""

EOS = "<|endoftext|>"
PROMPT = "<|prompt|>"
RESPONSE = "<|response|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (EOS, PROMPT, RESPONSE, PAD)

SPEC_FILE = "tokenizer.json"
RANKS_FILE = "tokenizer.tiktoken"


@dataclass(frozen=True)
class Tokenizer:
    """A tiktoken `Encoding` plus the chat template's special token ids."""

    encoding: tiktoken.Encoding
    identity: str

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    @property
    def eos_id(self) -> int:
        return self.encoding._special_tokens[EOS]

    @property
    def prompt_id(self) -> int:
        return self.encoding._special_tokens[PROMPT]

    @property
    def response_id(self) -> int:
        return self.encoding._special_tokens[RESPONSE]

    @property
    def pad_id(self) -> int:
        return self.encoding._special_tokens[PAD]

    def encode(self, text: str) -> list[int]:
        """Plain text to ids; special-token strings in user text stay ordinary text."""
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode(list(ids))


def _write_ranks(ranks: dict[bytes, int], path: Path) -> None:
    lines = (base64.b64encode(tok) + b" " + str(rank).encode() for tok, rank in ranks.items())
    path.write_bytes(b"\n".join(sorted(lines, key=lambda line: int(line.split()[1]))) + b"\n")


def _special_ids(first_id: int) -> dict[str, int]:
    return {tok: first_id + i for i, tok in enumerate(SPECIAL_TOKENS)}


def save_tokenizer(
    directory: str | Path,
    kind: str,
    *,
    texts: Iterable[str] = (),
    vocab_size: int = 2048,
    encoding: str = "gpt2",
) -> Tokenizer:
    """Build a tokenizer of `kind` and write it atomically to `directory`, which may hold a
    previous tokenizer (replaced whole) or nothing, never anything else."""
    directory = Path(directory)
    if directory.is_dir() and any(directory.iterdir()) and not (directory / SPEC_FILE).is_file():
        raise OutputError(f"{directory} holds files but no tokenizer; refusing to replace it")
    spec: dict[str, object] = {"kind": kind, "special_tokens": list(SPECIAL_TOKENS)}
    with publication() as out:
        tmp = out[directory]
        tmp.mkdir()
        if kind == "tiktoken":
            spec["encoding"] = encoding
            _base_encoding(encoding)  # fail here, not in a later stage, if it cannot load
        else:
            if kind == "bpe":
                ranks = train_bpe(texts, vocab_size, PAT_STR)
            elif kind == "bytes":
                ranks = {bytes([i]): i for i in range(256)}
            else:
                raise ValueError(f"unknown tokenizer kind {kind!r}")
            _write_ranks(ranks, tmp / RANKS_FILE)
            spec["pat_str"] = PAT_STR
            spec["ranks_file"] = RANKS_FILE
            spec["ranks_sha256"] = hashlib.sha256((tmp / RANKS_FILE).read_bytes()).hexdigest()
        (tmp / SPEC_FILE).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    return load_tokenizer(directory)


def _base_encoding(name: str) -> tiktoken.Encoding:
    try:
        return tiktoken.get_encoding(name)
    except Exception as exc:
        raise RuntimeError(
            f"tiktoken encoding {name!r} could not be loaded ({exc}). It is downloaded on first "
            "use: pre-fetch it into TIKTOKEN_CACHE_DIR on a machine with network access, or use "
            "tokenizer.kind: bpe."
        ) from exc


def load_tokenizer(directory: str | Path) -> Tokenizer:
    directory = Path(directory)
    if not (directory / SPEC_FILE).is_file():
        raise CheckpointError(f"{directory}: no tokenizer ({SPEC_FILE}); `dvc repro` writes it")
    spec_text = (directory / SPEC_FILE).read_text()
    try:
        spec = json.loads(spec_text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{directory / SPEC_FILE}: not valid JSON ({exc})") from None
    identity = hashlib.sha256(spec_text.encode()).hexdigest()[:16]
    if spec["kind"] == "tiktoken":
        base = _base_encoding(spec["encoding"])
        specials = dict(base._special_tokens)  # gpt2 already has <|endoftext|>: reuse it
        for token in SPECIAL_TOKENS:
            specials.setdefault(token, max(base.max_token_value, *specials.values()) + 1)
        encoding = tiktoken.Encoding(
            name=f"{base.name}-rlhf",
            pat_str=base._pat_str,
            mergeable_ranks=base._mergeable_ranks,
            special_tokens=specials,
        )
    else:
        # expected_hash makes tiktoken verify the file and bypass its path-keyed cache, which
        # would otherwise serve a stale copy after the tokenizer is retrained at the same path.
        ranks = load_tiktoken_bpe(
            str(directory / spec["ranks_file"]), expected_hash=spec["ranks_sha256"]
        )
        encoding = tiktoken.Encoding(
            name=f"rlhf-{spec['kind']}-{identity}",
            pat_str=spec["pat_str"],
            mergeable_ranks=ranks,
            special_tokens=_special_ids(len(ranks)),
        )
    return Tokenizer(encoding=encoding, identity=identity)
