"""Tokenizers for the pipeline, all encoded by tiktoken.

Four kinds share one identity hash and one on-disk spec (`tokenizer.json`). `bpe` and `bytes`
keep their ranks in tiktoken's own `.tiktoken` format beside it; `tiktoken` names an encoding;
`pretrained` keeps a copy of a Hugging Face model folder's tokenizer files (`hf/`) and encodes
them exactly as the model's own tokenizer does (`hf_vocab.py`). Checkpoints record the
identity so a model is never decoded with a tokenizer it was not trained with.

Each tokenizer also carries its chat frame: the ids around a prompt and the token that ends
an answer. The pipeline's own kinds frame with four special tokens of their own; a pretrained
model keeps its chat template's (`chat_template.py`), and pads with a token it already has, so
its embedding is never resized. How the frame is applied is `chat.py`'s business.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import tiktoken

from rlhf.atomic import publication
from rlhf.errors import CheckpointError, OutputError
from rlhf.tokenizer.bpe import train_bpe
from rlhf.tokenizer.chat_template import BUILTIN_FRAMES, ChatFrame, frame_from_template
from rlhf.tokenizer.hf_tokenizer_file import write_tokenizer_json
from rlhf.tokenizer.hf_vocab import PretrainedVocabulary, encoding_of, read_vocabulary

# GPT-2's pre-tokenization pattern, as tiktoken ships it for r50k/gpt2.
PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""

EOS = "<|endoftext|>"
PROMPT = "<|prompt|>"
RESPONSE = "<|response|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (EOS, PROMPT, RESPONSE, PAD)
# the frame of the pipeline's own kinds: `<|prompt|> prompt <|response|> answer <|endoftext|>`
OWN_FRAME = ChatFrame(prefix=PROMPT, infix=RESPONSE, end=EOS)

SPEC_FILE = "tokenizer.json"
RANKS_FILE = "tokenizer.tiktoken"
# the date a chat template that prints today's date sees (Llama-3's own default): pinned, so
# that the frame, and every tokenized row, is the same whatever day the tokenizer stage runs
TEMPLATE_DATE = date(2024, 7, 26)
PRETRAINED_DIR = "hf"  # a pretrained tokenizer's own files, as the model folder holds them
# the files of a Hugging Face tokenizer, whichever of them a model folder has
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "tokenizer.model", "chat_template.jinja",
)  # fmt: skip


@dataclass(frozen=True)
class Tokenizer:
    """A tiktoken `Encoding` plus the chat frame's token ids."""

    encoding: tiktoken.Encoding
    identity: str
    prefix: tuple[int, ...]  # ids before the prompt
    infix: tuple[int, ...]  # ids between the prompt and the answer (the generation prompt)
    eos_id: int  # the token that ends an answer
    pad_id: int  # fills batches; never attended to, so it may equal eos_id
    source: Path | None = None  # a pretrained tokenizer's files, which an export copies

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        """Plain text to ids; special-token strings in user text stay ordinary text."""
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode(list(ids))


def _write_ranks(ranks: dict[bytes, int], path: Path) -> None:
    lines = (base64.b64encode(tok) + b" " + str(rank).encode() for tok, rank in ranks.items())
    path.write_bytes(b"\n".join(sorted(lines, key=lambda line: int(line.split()[1]))) + b"\n")


def _read_ranks(path: Path, sha256: str) -> dict[bytes, int]:
    """The rank file `_write_ranks` wrote, checked against its digest. Read here rather than by
    tiktoken's `load_tiktoken_bpe`, which copies every file it loads into its cache folder
    (TIKTOKEN_CACHE_DIR) and fails where that folder is not writable, as in a container run
    by another user, and which keys the copy by path: a retrained tokenizer would be stale."""
    contents = path.read_bytes()
    if hashlib.sha256(contents).hexdigest() != sha256:
        raise CheckpointError(
            f"{path}: its contents do not match the tokenizer's spec; rerun the tokenizer "
            "stage (dvc repro tokenizer)"
        )
    pairs = (line.split() for line in contents.splitlines() if line)
    return {base64.b64decode(token): int(rank) for token, rank in pairs}


def _special_ids(first_id: int) -> dict[str, int]:
    return {tok: first_id + i for i, tok in enumerate(SPECIAL_TOKENS)}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pretrained_frame(vocab: PretrainedVocabulary, chat_template: str) -> tuple[ChatFrame, str]:
    """The chat frame `chat_template` names for this vocabulary (`auto`: its own template,
    else `plain`) and the pad token (its own, else the frame's end token, never attended to),
    or a CheckpointError naming the special tokens the frame needs and the vocabulary lacks."""
    if chat_template != "auto":
        frame = BUILTIN_FRAMES[chat_template]
    elif vocab.chat_template:
        frame = frame_from_template(
            vocab.chat_template,
            bos=vocab.bos,
            eos=vocab.eos,
            special_tokens=vocab.special_tokens,
            today=TEMPLATE_DATE,
            source=str(vocab.chat_template_file),
        )
    else:
        frame = BUILTIN_FRAMES["plain"]
    pad = vocab.pad or frame.end
    missing = [t for t in (frame.end, pad) if t not in vocab.special_tokens]
    if missing:
        raise CheckpointError(
            f"chat template {chat_template!r} needs special tokens the tokenizer lacks: "
            f"{missing}; pick another tokenizer.chat_template"
        )
    return frame, pad


def pretrained_tokenizer(folder: str | Path, chat_template: str = "auto") -> Tokenizer:
    """A model folder's own tokenizer, read in place (an external reward model's)."""
    folder = Path(folder)
    vocab = read_vocabulary(folder)
    frame, pad = pretrained_frame(vocab, chat_template)
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            digest.update(name.encode() + (folder / name).read_bytes())
    identity = digest.hexdigest()[:16]
    encoding = encoding_of(vocab, f"rlhf-pretrained-{identity}")
    return _framed(encoding, identity, frame, pad, folder)


def _pretrained_spec(source: Path, chat_template: str, tmp: Path) -> dict[str, object]:
    """Copy the folder's tokenizer files into `tmp/hf` and describe its frame and pad."""
    frame, pad = pretrained_frame(read_vocabulary(source), chat_template)
    (tmp / PRETRAINED_DIR).mkdir()
    files = {}
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, tmp / PRETRAINED_DIR / name)
            files[name] = _sha256(source / name)
    return {
        "source": str(source), "files": files, "prefix": frame.prefix, "infix": frame.infix,
        "end": frame.end, "pad": pad,
    }  # fmt: skip


def save_tokenizer(
    directory: str | Path,
    kind: str,
    *,
    texts: Iterable[str] = (),
    vocab_size: int = 2048,
    encoding: str = "gpt2",
    source: str | Path | None = None,
    chat_template: str = "auto",
) -> Tokenizer:
    """Build a tokenizer of `kind` and write it atomically to `directory`, which may hold a
    previous tokenizer (replaced whole) or nothing, never anything else. `pretrained` reads
    the Hugging Face folder `source` and frames chats with `chat_template` (`auto`: the
    folder's own template, else `plain`)."""
    directory = Path(directory)
    if directory.is_dir() and any(directory.iterdir()) and not (directory / SPEC_FILE).is_file():
        raise OutputError(f"{directory} holds files but no tokenizer; refusing to replace it")
    spec: dict[str, object] = {"kind": kind}
    with publication() as out:
        tmp = out[directory]
        tmp.mkdir()
        if kind == "pretrained":
            if source is None:
                raise ValueError("a pretrained tokenizer needs the model folder it comes from")
            spec |= _pretrained_spec(Path(source), chat_template, tmp)
        elif kind == "tiktoken":
            spec |= {"encoding": encoding, "special_tokens": list(SPECIAL_TOKENS)}
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
            spec["ranks_sha256"] = _sha256(tmp / RANKS_FILE)
            spec["special_tokens"] = list(SPECIAL_TOKENS)
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


def _own_encoding(spec: dict, directory: Path, identity: str) -> tiktoken.Encoding:
    """The encoding of the pipeline's own kinds: ranks plus its four special tokens."""
    if spec["kind"] == "tiktoken":
        base = _base_encoding(spec["encoding"])
        specials = dict(base._special_tokens)  # gpt2 already has <|endoftext|>: reuse it
        for token in SPECIAL_TOKENS:
            specials.setdefault(token, max(base.max_token_value, *specials.values()) + 1)
        return tiktoken.Encoding(
            name=f"{base.name}-rlhf",
            pat_str=base._pat_str,
            mergeable_ranks=base._mergeable_ranks,
            special_tokens=specials,
        )
    ranks = _read_ranks(directory / spec["ranks_file"], spec["ranks_sha256"])
    return tiktoken.Encoding(
        name=f"rlhf-{spec['kind']}-{identity}",
        pat_str=spec["pat_str"],
        mergeable_ranks=ranks,
        special_tokens=_special_ids(len(ranks)),
    )


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
    if spec["kind"] != "pretrained":
        return _framed(_own_encoding(spec, directory, identity), identity, OWN_FRAME, PAD, None)
    source = directory / PRETRAINED_DIR
    encoding = encoding_of(read_vocabulary(source), f"rlhf-pretrained-{identity}")
    frame = ChatFrame(spec["prefix"], spec["infix"], spec["end"])
    return _framed(encoding, identity, frame, spec["pad"], source)


def _framed(
    encoding: tiktoken.Encoding, identity: str, frame: ChatFrame, pad: str, source: Path | None
) -> Tokenizer:
    def ids(text: str) -> tuple[int, ...]:
        return tuple(encoding.encode(text, allowed_special="all"))

    return Tokenizer(
        encoding=encoding,
        identity=identity,
        prefix=ids(frame.prefix),
        infix=ids(frame.infix),
        eos_id=encoding.encode_single_token(frame.end),
        pad_id=encoding.encode_single_token(pad),
        source=source,
    )


# the pipeline's own frame as a Hugging Face chat template, for exported models
OWN_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    + PROMPT
    + "{{ message['content'] }}"
    + RESPONSE
    + "{% elif message['role'] == 'assistant' %}{{ message['content'] }}"
    + EOS
    + "{% endif %}{% endfor %}"
)


def write_hf_tokenizer(tokenizer: Tokenizer, folder: Path) -> None:
    """The tokenizer's files in Hugging Face layout in `folder`, so an exported model loads
    with its tokenizer and chat template: a pretrained tokenizer's own files, or for the
    pipeline's own kinds a byte-level BPE `tokenizer.json` built from the ranks."""
    if tokenizer.source is not None:
        for name in TOKENIZER_FILES:
            if (tokenizer.source / name).is_file():
                shutil.copyfile(tokenizer.source / name, folder / name)
        return
    write_tokenizer_json(tokenizer.encoding, folder / "tokenizer.json")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "pad_token": PAD,
        "chat_template": OWN_CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
