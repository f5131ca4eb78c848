"""A pretrained model's own tokenizer, read from its Hugging Face folder into tiktoken's terms.

The pipeline encodes with tiktoken only; `transformers` and `tokenizers` are never needed at run
time. A byte-level BPE tokenizer (GPT-2, Llama-3, Qwen2/Qwen3) is fully described by its
vocabulary, its merge order and its pre-tokenizer regex, which is exactly what tiktoken takes. Two
things can still differ, and both are checked here so that a vocabulary either encodes exactly as
the model's tokenizer or is refused with a message naming the file:

- tiktoken ranks a merge by the id of the token it makes, Hugging Face by the merge's position in
  the merges list, so ids must grow with that position;
- tiktoken merges any adjacent pair whose concatenation is a token and takes a whole pre-token
  that is a token as it is, while Hugging Face applies only the listed merges (see
  `_check_merge_paths` for what that requires).

Sources, tried in this order: `tokenizer.json` (the fast-tokenizer file), `vocab.json` +
`merges.txt` (GPT-2's slow files), and `tokenizer.model` when it is a tiktoken rank file
(Llama-3). `tokenizer_config.json` and `chat_template.jinja` add the special token roles and the
chat template.
"""

from __future__ import annotations

import base64
import binascii
import json
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import tiktoken

from rlhf.errors import CheckpointError

# What Hugging Face's ByteLevel pre-tokenizer splits with when `use_regex` is true: GPT-2's regex.
GPT2_PAT_STR = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Meta's Llama-3 tokenizer (llama3/tokenizer.py), for a bare tiktoken rank file.
LLAMA3_PAT_STR = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

TOKENIZER_JSON = "tokenizer.json"
VOCAB_JSON = "vocab.json"
MERGES_TXT = "merges.txt"
RANK_FILE = "tokenizer.model"
CONFIG_JSON = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
MAX_TEMPLATE_BYTES = 1 << 20  # real chat templates are a few kilobytes

GPT2_EOS = "<|endoftext|>"
# Meta's Llama-3.1 special tokens, in id order after the mergeable ranks (256 in all).
LLAMA3_SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)
LLAMA3_N_SPECIALS = 256
# Unicode normalizations a `tokenizer.json` normalizer may apply: `unicodedata` does them exactly.
NORMALIZATIONS = ("NFC", "NFD", "NFKC", "NFKD")


@dataclass(frozen=True)
class PretrainedVocabulary:
    """What tiktoken needs to encode exactly as the model's own tokenizer, plus its special tokens.

    `normalization` names the Unicode form (e.g. "NFC", as Qwen2 applies) the text is put in
    before encoding, or is None; `encoding_of` builds an encoding that applies it.
    """

    ranks: dict[bytes, int]
    pat_str: str
    special_tokens: dict[str, int]
    bos: str | None
    eos: str | None
    pad: str | None
    chat_template: str | None
    normalization: str | None = None
    chat_template_file: Path | None = None  # where chat_template was read, for messages


@dataclass(frozen=True)
class _Source:
    """One tokenizer file's contribution, before tokenizer_config.json names the roles."""

    ranks: dict[bytes, int]
    pat_str: str
    special_tokens: dict[str, int]
    roles: dict[str, str | None] = field(default_factory=dict)  # conventional bos/eos/pad
    normalization: str | None = None


class NormalizingEncoding(tiktoken.Encoding):
    """A tiktoken encoding that first puts text in a Unicode normal form, as the model's
    tokenizer.json normalizer does (Qwen2's NFC): otherwise text that is not already in that form
    would get other ids than the model was trained on. Batch encoding goes through these two."""

    def __init__(self, name: str, *, normalization: str, **kwargs: object) -> None:
        super().__init__(name, **kwargs)
        self.normalization = normalization

    def __getstate__(self) -> object:
        return {**super().__getstate__(), "normalization": self.normalization}

    def encode_ordinary(self, text: str) -> list[int]:
        return super().encode_ordinary(unicodedata.normalize(self.normalization, text))

    def encode(self, text: str, **kwargs: object) -> list[int]:
        return super().encode(unicodedata.normalize(self.normalization, text), **kwargs)


def encoding_of(vocab: PretrainedVocabulary, name: str) -> tiktoken.Encoding:
    """The tiktoken encoding of `vocab`; `encode_ordinary` then matches the model's tokenizer."""
    arguments = {
        "pat_str": vocab.pat_str,
        "mergeable_ranks": vocab.ranks,
        "special_tokens": vocab.special_tokens,
    }
    if vocab.normalization is None:
        return tiktoken.Encoding(name, **arguments)
    return NormalizingEncoding(name, normalization=vocab.normalization, **arguments)


def read_vocabulary(folder: str | Path) -> PretrainedVocabulary:
    """Read the tokenizer in a Hugging Face model folder; CheckpointError if it cannot be used."""
    folder = Path(folder)
    config = _read_json(folder / CONFIG_JSON) if (folder / CONFIG_JSON).is_file() else {}
    source = _read_source(folder, config)
    _check_ids_distinct(source, folder)
    roles = {
        role: _role(config, role, source, folder / CONFIG_JSON) for role in ("bos", "eos", "pad")
    }
    return PretrainedVocabulary(
        ranks=source.ranks,
        pat_str=source.pat_str,
        special_tokens=source.special_tokens,
        **_chat_template(folder, config),
        normalization=source.normalization,
        **roles,
    )


def _read_source(folder: Path, config: dict) -> _Source:
    if (folder / TOKENIZER_JSON).is_file():
        return _from_tokenizer_json(folder / TOKENIZER_JSON)
    if (folder / VOCAB_JSON).is_file() and (folder / MERGES_TXT).is_file():
        return _from_slow_files(folder, config)
    if (folder / RANK_FILE).is_file():
        return _from_rank_file(folder / RANK_FILE, config)
    what = "does not exist" if not folder.is_dir() else "holds no tokenizer"
    raise CheckpointError(
        f"{folder} {what}: looked for {TOKENIZER_JSON}, {VOCAB_JSON} + {MERGES_TXT}, or "
        f"{RANK_FILE} (a tiktoken rank file); point it at the model's Hugging Face folder"
    )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: not UTF-8 text ({exc})") from None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


# --- tokenizer.json ---------------------------------------------------------------------------


def _from_tokenizer_json(path: Path) -> _Source:
    spec = _read_json(path)
    model = spec.get("model") or {}
    _check_model(model, path)
    pat_str = _pattern(spec.get("pre_tokenizer"), path)
    normalization = _normalization(spec.get("normalizer"), path)
    special_tokens = {token["content"]: token["id"] for token in spec.get("added_tokens") or []}
    special_ids = set(special_tokens.values())
    ranks = {
        _token_bytes(text, path): rank
        for text, rank in model["vocab"].items()
        if rank not in special_ids
    }
    merges = [_merge_pair(merge, path) for merge in model.get("merges") or []]
    _check_merges(ranks, merges, path, whole_words=bool(model.get("ignore_merges")))
    roles = {"bos": GPT2_EOS, "eos": GPT2_EOS} if pat_str == GPT2_PAT_STR else {}
    return _Source(
        ranks=ranks,
        pat_str=pat_str,
        special_tokens=special_tokens,
        roles={role: token for role, token in roles.items() if token in special_tokens},
        normalization=normalization,
    )


def _check_model(model: dict, path: Path) -> None:
    kind = model.get("type")
    if kind != "BPE":
        raise CheckpointError(
            f"{path}: a {kind} tokenizer model is not supported; only byte-level BPE "
            "(GPT-2, Llama-3, Qwen2/Qwen3) can be encoded by tiktoken"
        )
    unsupported = {
        "byte_fallback": "byte_fallback (a SentencePiece-style BPE)",
        "dropout": "BPE dropout",
        "continuing_subword_prefix": "a continuing-subword prefix",
        "end_of_word_suffix": "an end-of-word suffix",
    }
    for key, what in unsupported.items():
        if model.get(key):
            raise CheckpointError(f"{path}: {what} is not supported; only byte-level BPE is")


def _merge_pair(merge: str | list[str], path: Path) -> tuple[bytes, bytes]:
    """A merge as written by either tokenizers format: "a b" or ["a", "b"]."""
    left, right = merge.split(" ") if isinstance(merge, str) else merge
    return _token_bytes(left, path), _token_bytes(right, path)


def _pattern(pre_tokenizer: dict | None, path: Path) -> str:
    """The one regex the pre-tokenizer splits with: GPT-2's (ByteLevel with use_regex) or a
    Split's (Qwen2, converted Llama-3). Anything else cannot be a single tiktoken pattern."""
    steps = _flatten(pre_tokenizer, "pretokenizers")
    kinds = [step.get("type") for step in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        pat_str = GPT2_PAT_STR
    elif kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        pat_str = _split_regex(steps[0], path)
    else:
        raise CheckpointError(
            f"{path}: pre_tokenizer {kinds or None} is not supported; tiktoken needs byte-level "
            "pre-tokenization: ByteLevel with use_regex, or a regex Split then ByteLevel"
        )
    if steps[-1].get("add_prefix_space"):
        raise CheckpointError(f"{path}: ByteLevel add_prefix_space changes the text; unsupported")
    _check_pattern(pat_str, path)
    return pat_str


def _split_regex(split: dict, path: Path) -> str:
    pattern = split.get("pattern") or {}
    if "Regex" not in pattern or split.get("behavior") != "Isolated" or split.get("invert"):
        raise CheckpointError(
            f"{path}: a Split pre-tokenizer must be an isolated, non-inverted regex to be "
            f"encoded by tiktoken; found {split}"
        )
    return pattern["Regex"]


def _normalization(normalizer: dict | None, path: Path) -> str | None:
    """The Unicode normal form the normalizer applies, if any; other normalizers change the text
    in ways tiktoken cannot reproduce."""
    forms = {step.get("type") for step in _flatten(normalizer, "normalizers")}
    if not forms:
        return None
    if len(forms) == 1 and forms <= set(NORMALIZATIONS):
        return forms.pop()
    raise CheckpointError(
        f"{path}: normalizer {sorted(forms)} changes the text before tokenizing; only a Unicode "
        f"normal form ({', '.join(NORMALIZATIONS)}) is supported"
    )


def _flatten(step: dict | None, key: str) -> list[dict]:
    """A normalizer or pre-tokenizer as the list of steps a `Sequence` spells out."""
    if step is None:
        return []
    if step.get("type") == "Sequence":
        return [inner for nested in step[key] for inner in _flatten(nested, key)]
    return [step]


def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: byte-level vocabularies spell each byte as one
    printable character (space is "Ġ"), which this turns back into the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    others = (byte for byte in range(256) if byte not in printable)
    characters = {chr(byte): byte for byte in printable}
    characters |= {chr(256 + index): byte for index, byte in enumerate(others)}
    return characters


BYTE_OF = _byte_decoder()


def _token_bytes(text: str, path: Path) -> bytes:
    try:
        return bytes(BYTE_OF[character] for character in text)
    except KeyError:
        raise CheckpointError(
            f"{path}: vocabulary entry {text!r} is not byte-level (a character outside GPT-2's "
            "byte alphabet); only byte-level BPE can be encoded by tiktoken"
        ) from None


# --- merge order ------------------------------------------------------------------------------


def _check_merges(
    ranks: dict[bytes, int],
    merges: list[tuple[bytes, bytes]],
    path: Path,
    *,
    whole_words: bool,
) -> None:
    """Refuse a vocabulary tiktoken would encode differently from the listed merges.

    Several merges may make one token (vocabularies converted from tiktoken list every split, as
    Llama-3's does): should two of them apply in one word at once, tiktoken takes the leftmost,
    the list the earlier one. Such vocabularies come from tiktoken, so its choice is the original.
    """
    _check_bytes_covered(ranks, path)
    last = -1
    for position, (left, right) in enumerate(merges):
        missing = [part for part in (left, right, left + right) if part not in ranks]
        if missing:
            raise CheckpointError(
                f"{path}: merge #{position} {left!r} + {right!r} uses or makes {missing[0]!r}, "
                "which is not a mergeable token; the vocabulary cannot be encoded by tiktoken"
            )
        made = ranks[left + right]
        if made < last:
            raise CheckpointError(
                f"{path}: merge #{position} {left!r} + {right!r} makes token id {made}, lower "
                f"than id {last} made by an earlier merge; tiktoken ranks merges by token id, so "
                "this vocabulary cannot be encoded exactly (its ids are not in merge order)"
            )
        last = made
    _check_merge_paths(ranks, merges, path, whole_words=whole_words)


def _check_bytes_covered(ranks: dict[bytes, int], path: Path) -> None:
    missing = [byte for byte in range(256) if bytes([byte]) not in ranks]
    if missing:
        raise CheckpointError(
            f"{path}: the vocabulary has no token for {len(missing)} byte value(s) (first: "
            f"{missing[0]:#04x}); tiktoken needs all 256 bytes as tokens"
        )


def _check_merge_paths(
    ranks: dict[bytes, int],
    merges: list[tuple[bytes, bytes]],
    path: Path,
    *,
    whole_words: bool,
) -> None:
    """Check that every token's bytes merge, under the listed merges, the way tiktoken's would.

    Inside a word, the bytes a token spans are merged exactly as that token's bytes alone are
    (merges never cross a finished token's edges), so tiktoken and the merges list can only
    disagree where the merges of a token's own bytes end in two parts that concatenate to it but
    are not a listed merge (tiktoken merges them, Hugging Face does not). And a whole pre-token
    that is a token is taken as it is by tiktoken, by Hugging Face only with `ignore_merges`
    (`whole_words`): without it, every token's bytes must merge back into that token.
    """
    # by ids, which hash fast; a pair listed twice keeps its last position, as in Hugging Face
    merge_of = {
        (ranks[left], ranks[right]): (position, ranks[left + right])
        for position, (left, right) in enumerate(merges)
    }
    byte_ids = [ranks[bytes([byte])] for byte in range(256)]
    for token, token_id in ranks.items():
        parts = _merge_by_list([byte_ids[byte] for byte in token], merge_of)
        if len(parts) == 2 or (len(parts) > 1 and not whole_words):
            token_of = {rank: text for text, rank in ranks.items()}
            raise CheckpointError(
                f"{path}: the merges list splits token {token!r} (id {token_id}) into "
                f"{[token_of[part] for part in parts]} but tiktoken would keep it whole; this "
                "vocabulary cannot be encoded exactly"
            )


def _merge_by_list(parts: list[int], merge_of: dict[tuple[int, int], tuple[int, int]]) -> list[int]:
    """Hugging Face's BPE on one word: apply the earliest listed merge, leftmost first, until
    none applies."""
    while len(parts) > 1:
        listed = [
            (merge_of[pair][0], index)
            for index, pair in enumerate(pairwise(parts))
            if pair in merge_of
        ]
        if not listed:
            break
        _, index = min(listed)
        parts[index : index + 2] = [merge_of[parts[index], parts[index + 1]][1]]
    return parts


def _check_pattern(pat_str: str, path: Path) -> None:
    """Compile the pattern with tiktoken's own regex engine (fancy-regex), which lacks some of
    Oniguruma's syntax, so a pattern it rejects is reported here rather than at first use."""
    try:
        tiktoken.Encoding(
            "pattern-check",
            pat_str=pat_str,
            mergeable_ranks={bytes([byte]): byte for byte in range(256)},
            special_tokens={},
        )
    except ValueError as exc:
        raise CheckpointError(
            f"{path}: tiktoken's regex engine rejects the pre-tokenizer pattern {pat_str!r} "
            f"({exc}); it must be rewritten in fancy-regex syntax"
        ) from None


# --- vocab.json + merges.txt ------------------------------------------------------------------


def _from_slow_files(folder: Path, config: dict) -> _Source:
    vocab = _read_json(folder / VOCAB_JSON)
    special_tokens = _config_specials(config, folder / CONFIG_JSON)
    if GPT2_EOS in vocab:
        special_tokens.setdefault(GPT2_EOS, vocab[GPT2_EOS])
    special_ids = set(special_tokens.values())
    path = folder / VOCAB_JSON
    ranks = {
        _token_bytes(text, path): rank for text, rank in vocab.items() if rank not in special_ids
    }
    if GPT2_EOS not in special_tokens:
        special_tokens[GPT2_EOS] = max(max(ranks.values()), *special_ids, -1) + 1
    merges_path = folder / MERGES_TXT
    lines = merges_path.read_text(encoding="utf-8").splitlines()
    merges = [
        _merge_pair(line, merges_path)
        for line in lines
        if line.strip() and not line.startswith("#version")
    ]
    _check_merges(ranks, merges, merges_path, whole_words=False)
    return _Source(
        ranks=ranks,
        pat_str=GPT2_PAT_STR,
        special_tokens=special_tokens,
        roles={"bos": GPT2_EOS, "eos": GPT2_EOS},
    )


def _config_specials(config: dict, path: Path) -> dict[str, int]:
    """`added_tokens_decoder` of tokenizer_config.json: {"128000": {"content": ...}, ...}."""
    try:
        return {
            entry["content"]: int(token_id)
            for token_id, entry in (config.get("added_tokens_decoder") or {}).items()
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{path}: added_tokens_decoder must map ids to {{'content': ...}} ({exc!r})"
        ) from None


# --- tokenizer.model as a tiktoken rank file --------------------------------------------------


def _from_rank_file(path: Path, config: dict) -> _Source:
    ranks = _read_ranks(path)
    _check_bytes_covered(ranks, path)
    special_tokens = _config_specials(config, path.parent / CONFIG_JSON)
    roles: dict[str, str | None] = {}
    if not special_tokens:
        special_tokens = _llama3_specials(len(ranks))
        roles = {"bos": LLAMA3_SPECIALS[0], "eos": LLAMA3_SPECIALS[1], "pad": LLAMA3_SPECIALS[4]}
    _check_pattern(LLAMA3_PAT_STR, path)
    return _Source(ranks=ranks, pat_str=LLAMA3_PAT_STR, special_tokens=special_tokens, roles=roles)


def _read_ranks(path: Path) -> dict[bytes, int]:
    """Lines `base64token rank`. A SentencePiece model (Llama-2 and earlier) is binary protobuf,
    which fails here with a message saying so."""
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
        return {
            base64.b64decode(token, validate=True): int(rank)
            for token, rank in (line.split() for line in lines if line.strip())
        }
    except (UnicodeDecodeError, ValueError, binascii.Error):
        raise CheckpointError(
            f"{path}: not a tiktoken rank file (lines of 'base64-token rank'); a SentencePiece "
            "tokenizer.model (Llama-2 and earlier) is not supported: use a model whose folder "
            f"has a byte-level BPE {TOKENIZER_JSON}"
        ) from None


def _llama3_specials(first_id: int) -> dict[str, int]:
    """Meta's Llama-3.1 convention: 256 special tokens right after the mergeable ranks."""
    reserved = (
        f"<|reserved_special_token_{index}|>"
        for index in range(2, LLAMA3_N_SPECIALS - len(LLAMA3_SPECIALS) + 2)
    )
    names = [*LLAMA3_SPECIALS, *reserved]
    return {name: first_id + offset for offset, name in enumerate(names)}


# --- tokenizer_config.json --------------------------------------------------------------------


def _check_ids_distinct(source: _Source, folder: Path) -> None:
    ids = [*source.ranks.values(), *source.special_tokens.values()]
    shared = sorted(token_id for token_id, count in Counter(ids).items() if count > 1)
    if shared:
        raise CheckpointError(
            f"{folder}: token id(s) {shared[:5]} are given to more than one token; tiktoken "
            "needs every id to decode to one token"
        )


def _role(config: dict, role: str, source: _Source, path: Path) -> str | None:
    """`bos_token` etc. from tokenizer_config.json (a string or {"content": ...}); when the key
    is absent, the source's convention. A named token must be one of the special tokens."""
    key = f"{role}_token"
    value = config[key] if key in config else source.roles.get(role)
    token = value.get("content") if isinstance(value, dict) else value
    if token is not None and token not in source.special_tokens:
        raise CheckpointError(
            f"{path}: {key} {token!r} is not one of the tokenizer's special tokens; the pipeline "
            "needs it as one token id"
        )
    return token


def _chat_template(folder: Path, config: dict) -> dict[str, str | Path | None]:
    """chat_template.jinja (newer transformers writes it) over tokenizer_config.json's
    chat_template, which is a string or a list of {name, template} (then "default"); with
    the file it came from."""
    if (folder / TEMPLATE_FILE).is_file():
        path = folder / TEMPLATE_FILE
        if path.stat().st_size > MAX_TEMPLATE_BYTES:
            raise CheckpointError(
                f"{path}: {path.stat().st_size:,} bytes, more than a chat template's "
                f"{MAX_TEMPLATE_BYTES:,}"
            )
        return {"chat_template": _read_text(path), "chat_template_file": path}
    path, template = folder / CONFIG_JSON, config.get("chat_template")
    if isinstance(template, list):
        if not all(isinstance(entry, dict) for entry in template):
            raise CheckpointError(
                f"{path}: chat_template is a list, but not of {{name, template}} objects"
            )
        template = {e.get("name"): e.get("template") for e in template}.get("default")
    if template is not None and not isinstance(template, str):
        raise CheckpointError(
            f"{path}: chat_template is {type(template).__name__}, not a template (a string, or "
            "a list of {name, template} with one named 'default')"
        )
    return {"chat_template": template, "chat_template_file": path if template else None}
