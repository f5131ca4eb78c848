import os
import subprocess
import sys

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from tiktoken.load import load_tiktoken_bpe

from rlhf.errors import CheckpointError
from rlhf.tokenizer.bpe import train_bpe
from rlhf.tokenizer.chat import prompt_ids
from rlhf.tokenizer.hf_vocab import encoding_of, read_vocabulary
from rlhf.tokenizer.tokenizer import (
    EOS,
    PAT_STR,
    SPECIAL_TOKENS,
    load_tokenizer,
    save_tokenizer,
    write_hf_tokenizer,
)

CORPUS = [
    "Greet Alice.", "Hello, Alice!", "What is 3 plus 4?", "3 + 4 = 7.",
    "Repeat the word apple 3 times.", "apple apple apple", "Sorry, I can't help with that.",
] * 20  # fmt: skip


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("bpe"), "bpe", texts=CORPUS, vocab_size=320)


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("bytes"), "bytes")


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_bpe_round_trips_any_unicode(bpe, text):
    assert bpe.decode(bpe.encode(text)) == text


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_bytes_round_trips_any_unicode(byte_level, text):
    ids = byte_level.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert byte_level.decode(ids) == text


def test_bpe_learns_merges_and_compresses(bpe):
    assert 256 < bpe.vocab_size - len(SPECIAL_TOKENS) <= 320
    text = "Hello, Alice! apple apple apple"
    assert len(bpe.encode(text)) < len(text.encode()) / 2


def test_training_is_deterministic():
    assert train_bpe(CORPUS, 300, PAT_STR) == train_bpe(CORPUS, 300, PAT_STR)


def test_training_stops_when_no_pair_repeats():
    ranks = train_bpe(["ab"], 10_000, PAT_STR)
    assert len(ranks) == 256  # "ab" occurs once: nothing worth merging


def test_rank_file_is_tiktoken_format(bpe, tmp_path):
    directory = save_tokenizer(tmp_path / "tok", "bpe", texts=CORPUS, vocab_size=300)
    ranks = load_tiktoken_bpe(str(tmp_path / "tok" / "tokenizer.tiktoken"))
    assert sorted(ranks.values()) == list(range(len(ranks)))
    assert isinstance(directory.encoding, tiktoken.Encoding)


def test_special_tokens_are_distinct_and_not_parsed_from_user_text(bpe):
    (prompt,), (response,) = bpe.prefix, bpe.infix  # `<|prompt|> p <|response|> r <|endoftext|>`
    ids = {bpe.eos_id, bpe.pad_id, prompt, response}
    assert len(ids) == 4 and min(ids) >= bpe.vocab_size - 4
    assert bpe.eos_id not in bpe.encode(f"say {EOS} now")
    assert prompt_ids(bpe, "hi") == [prompt, *bpe.encode("hi"), response]


def test_an_own_tokenizer_exports_as_a_fast_tokenizer_with_the_same_ids(bpe, tmp_path):
    """`rlhf export` writes the trained BPE as tokenizer.json: the `tokenizers` library and
    our own reader of Hugging Face folders then encode exactly as tiktoken does."""
    tokenizers = pytest.importorskip("tokenizers")
    write_hf_tokenizer(bpe, tmp_path)
    theirs = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    reread = encoding_of(read_vocabulary(tmp_path), "reread")
    texts = [*CORPUS, "Ünïcödé  text\n\n\tand 12345 digits 🙂 don't", "  trailing   "]
    for text in texts:
        assert theirs.encode(text, add_special_tokens=False).ids == bpe.encode(text)
        assert reread.encode_ordinary(text) == bpe.encode(text)
    assert theirs.token_to_id(EOS) == bpe.eos_id


def test_retrained_tokenizer_at_same_path_is_not_served_stale(tmp_path):
    first = save_tokenizer(tmp_path / "tok", "bpe", texts=CORPUS, vocab_size=300)
    second = save_tokenizer(tmp_path / "tok", "bpe", texts=["zzzz yyyy"] * 50, vocab_size=300)
    assert first.identity != second.identity
    assert load_tokenizer(tmp_path / "tok").vocab_size == second.vocab_size
    assert second.encoding._mergeable_ranks != first.encoding._mergeable_ranks


def test_named_encoding_without_cache_fails_with_guidance(tmp_path):
    code = (
        "from rlhf.tokenizer.tokenizer import save_tokenizer\n"
        f"save_tokenizer({str(tmp_path / 'tok')!r}, 'tiktoken', encoding='gpt2')\n"
    )
    env = {
        **os.environ,
        "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache"),
        "HTTPS_PROXY": "http://127.0.0.1:9",  # refuse the download at once
        "https_proxy": "http://127.0.0.1:9",
    }
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode != 0
    assert "TIKTOKEN_CACHE_DIR" in result.stderr and "tokenizer.kind: bpe" in result.stderr
    assert not (tmp_path / "tok").exists()


def test_a_tokenizer_loads_where_tiktokens_cache_cannot_be_written(tmp_path, monkeypatch):
    """tiktoken's loader copies every file into TIKTOKEN_CACHE_DIR and fails where it cannot
    write there (the image's cache, run as another user): the pipeline reads its own file."""
    saved = save_tokenizer(tmp_path / "tok", "bpe", texts=CORPUS, vocab_size=300)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(blocked / "cache"))
    assert load_tokenizer(tmp_path / "tok").encode("Greet Alice.") == saved.encode("Greet Alice.")
    ranks = tmp_path / "tok" / "tokenizer.tiktoken"
    ranks.write_bytes(ranks.read_bytes() + b"\n")
    with pytest.raises(CheckpointError, match=r"tokenizer.tiktoken: its contents do not match"):
        load_tokenizer(tmp_path / "tok")


def test_a_named_tiktoken_encoding_keeps_its_ranks_and_gets_the_chat_tokens(tmp_path, monkeypatch):
    """`tokenizer.kind: tiktoken` (an encoding tiktoken names, registered here as a plugin
    would, since named encodings download on first use): its ranks and its own end token,
    the chat frame's other tokens added after its vocabulary."""
    import tiktoken.registry as registry

    from rlhf.tokenizer.tokenizer import PAT_STR

    registry.list_encoding_names()  # tiktoken reads its plugins' constructors first
    ranks = {bytes([i]): i for i in range(256)}
    named = {"pat_str": PAT_STR, "mergeable_ranks": ranks, "special_tokens": {EOS: 256}}
    monkeypatch.setitem(
        registry.ENCODING_CONSTRUCTORS, "tiny_bytes", lambda: named | {"name": "tiny_bytes"}
    )
    tokenizer = save_tokenizer(tmp_path / "tok", "tiktoken", encoding="tiny_bytes")
    assert tokenizer.encode("héllo") == list("héllo".encode())  # its own ranks
    assert tokenizer.eos_id == 256  # its end token, reused
    assert tokenizer.vocab_size == 256 + len(SPECIAL_TOKENS)
    assert load_tokenizer(tmp_path / "tok").encode("héllo") == tokenizer.encode("héllo")
    with pytest.raises(RuntimeError, match="tiktoken encoding 'no_such' could not be loaded"):
        save_tokenizer(tmp_path / "other", "tiktoken", encoding="no_such")
