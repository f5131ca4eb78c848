"""Hugging Face checkpoint folders load into our backbones and agree with transformers: tiny
random models of each family, saved with `save_pretrained`, loaded with `rlhf.models.hf`."""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from rlhf.errors import CheckpointError
from rlhf.models import registry
from rlhf.models.backbone import freeze
from rlhf.models.gpt import GPT, GPTConfig
from rlhf.models.hf import load_folder, save_folder
from rlhf.models.llama import LlamaConfig
from rlhf.models.llama import convert as llama_convert
from rlhf.models.packing import packed_hidden_states
from rlhf.models.registry import build
from rlhf.sampling.forward import response_forward
from rlhf.sampling.generate import generate
from rlhf.sampling.sampler import SamplingConfig
from rlhf.tokenizer.tokenizer import Tokenizer, save_tokenizer

transformers = pytest.importorskip("transformers")

from hf_families import FAMILIES, SHAPE, VOCAB  # noqa: E402

EOS, PAD = VOCAB - 2, VOCAB - 1


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request, tmp_path_factory):
    """(transformers model, ours loaded from its save_pretrained folder, the folder)."""
    torch.manual_seed(0)
    reference = FAMILIES[request.param]().eval()
    folder = tmp_path_factory.mktemp(request.param)
    reference.save_pretrained(folder)
    return reference, load_folder(folder).eval(), folder


def left_padded(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(0, EOS, (n,), generator=generator)
        mask[row, width - n :] = True
    return ids, mask


@torch.no_grad()
def test_logits_match_transformers_on_left_padded_batches(pair):
    reference, ours, _ = pair
    ids, mask = left_padded([5, 17, 11, 1])
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # what HF generation passes
    expected = reference(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
    padded = ours(ids, mask)
    packed = ours.lm_logits(packed_hidden_states(ours, ids, mask))
    for logits in (padded, packed):
        assert (logits[mask] - expected[mask]).abs().max() <= 1e-4


@torch.no_grad()
def test_greedy_kv_cache_generation_matches_transformers_generate(pair):
    reference, ours, _ = pair
    ids, mask = left_padded([4, 9, 7])
    prompts = [row[keep].tolist() for row, keep in zip(ids, mask, strict=True)]
    config = SamplingConfig(max_new_tokens=32, greedy=True)
    mine = generate(ours, prompts, eos_id=EOS, pad_id=PAD, config=config)
    theirs = reference.generate(
        input_ids=ids, attention_mask=mask.long(), max_new_tokens=32, do_sample=False,
        eos_token_id=EOS, pad_token_id=PAD, suppress_tokens=[PAD],
    )[:, ids.shape[1] :]  # fmt: skip
    for row in range(len(prompts)):
        expected = theirs[row].tolist()
        if EOS in expected:
            expected = expected[: expected.index(EOS) + 1]
        assert mine.tokens[row][mine.mask[row]].tolist() == expected


def test_unsupported_or_incomplete_folders_are_one_clear_error(pair, tmp_path):
    _, _, folder = pair
    config = json.loads((folder / "config.json").read_text())
    broken = tmp_path / "m"
    broken.mkdir()
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_folder(broken)
    (broken / "config.json").write_text(json.dumps(config | {"model_type": "mamba"}))
    with pytest.raises(CheckpointError, match="model_type 'mamba' is not supported"):
        load_folder(broken)
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"no model\.safetensors"):
        load_folder(broken)


def test_sizes_in_config_json_are_checked_before_anything_is_built(pair, tmp_path):
    """A billion layers (the memory preflight hung on it), a negative width (a traceback
    from torch), a fraction, a string: one error naming the file and the key, at once."""
    _, _, folder = pair
    config = json.loads((folder / "config.json").read_text())
    layers, width = (
        ("n_layer", "n_embd") if "n_layer" in config else ("num_hidden_layers", "hidden_size")
    )
    broken = tmp_path / "m"
    broken.mkdir()
    for key, value in ((layers, 1_000_000_000), (width, -64), (layers, 2.5), (width, "64")):
        (broken / "config.json").write_text(json.dumps(config | {key: value}))
        with pytest.raises(CheckpointError, match=rf"config\.json: {key} = .*whole number"):
            load_folder(broken)
    heads = "n_head" if "n_head" in config else "num_attention_heads"
    (broken / "config.json").write_text(json.dumps(config | {heads: 3}))
    with pytest.raises(
        CheckpointError, match=rf"config\.json: .*{heads} = 3.*multiple|multiple of {heads} = 3"
    ):
        load_folder(broken)


@torch.no_grad()
def test_an_exported_folder_reloads_in_transformers_with_the_same_logits(pair, tmp_path):
    reference, ours, _ = pair
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(save_folder(ours, tmp_path / "x"))
    ids = torch.randint(0, EOS, (2, 12), generator=torch.Generator().manual_seed(2))
    expected = reference(input_ids=ids).logits
    assert (reloaded.eval()(input_ids=ids).logits - expected).abs().max() <= 1e-5


@torch.no_grad()
def test_a_model_trained_here_exports_as_gpt2(tmp_path):
    """The scratch GPT (exact GELU, its own MLP width) is a GPT-2 that transformers loads."""
    torch.manual_seed(3)
    ours = GPT(
        GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=2, n_head=2, n_embd=32, mlp_width=48)
    ).eval()
    folder = save_folder(ours, tmp_path / "gpt")
    assert json.loads((folder / "config.json").read_text())["activation_function"] == "gelu"
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.randint(0, VOCAB, (2, 10))
    assert (reloaded(input_ids=ids).logits - ours(ids)).abs().max() <= 1e-5
    with pytest.raises(ValueError, match="bias: false"):
        save_folder(GPT(GPTConfig(vocab_size=VOCAB, bias=False)), tmp_path / "nobias")


CLASSIFIERS = {
    "gpt2": lambda: transformers.GPT2ForSequenceClassification(
        transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4,
                                n_positions=128, num_labels=1, pad_token_id=PAD)
    ),
    "qwen3": lambda: transformers.Qwen3ForSequenceClassification(
        transformers.Qwen3Config(**SHAPE, head_dim=32, num_labels=1, pad_token_id=PAD)
    ),
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(CLASSIFIERS))
@torch.no_grad()
def test_a_sequence_classifier_loads_as_a_reward_model_and_exports_back(family, tmp_path):
    """A one-label *ForSequenceClassification folder (a reward model trained elsewhere) scores
    with our reward head at each row's last token as transformers does, and our reward model
    exports as one."""
    torch.manual_seed(4)
    reference = CLASSIFIERS[family]().eval()
    reference.save_pretrained(tmp_path / "rm")
    ours = load_folder(tmp_path / "rm").eval()
    ids = torch.randint(0, EOS, (3, 9), generator=torch.Generator().manual_seed(5))
    expected = reference(input_ids=ids).logits[:, 0]
    assert (ours.rewards(ours.hidden_states(ids))[:, -1] - expected).abs().max() <= 1e-4
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(
        save_folder(ours, tmp_path / "out", reward_model=True), pad_token_id=PAD
    ).eval()
    assert (reloaded(input_ids=ids).logits[:, 0] - expected).abs().max() <= 1e-5


def test_a_pretrained_context_is_cut_to_block_size(pair):
    reference, _, folder = pair
    ours = load_folder(folder, block_size=24).eval()
    assert ours.max_seq_len == 24
    ids = torch.randint(0, EOS, (2, 24), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert (ours(ids) - reference(input_ids=ids).logits).abs().max() <= 1e-4
    with pytest.raises(CheckpointError, match="exceeds the model's context of 128"):
        load_folder(folder, block_size=129)


def test_activation_checkpointing_gives_the_same_gradients(pair):
    _, ours, _ = pair
    ids = torch.randint(0, EOS, (2, 16), generator=torch.Generator().manual_seed(7))
    grads = []
    for checkpointed in (False, True):
        ours.zero_grad()
        ours.activation_checkpointing = checkpointed
        ours(ids).logsumexp(-1).mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in ours.parameters() if p.grad is not None]))
    ours.activation_checkpointing = False
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_a_frozen_bf16_reference_gives_close_log_probs(pair):
    """`memory.frozen_bf16`: the reference policy in bfloat16 weights, without gradients,
    gives the log-probs of its float32 self to within bf16 precision."""
    _, ours, folder = pair
    frozen = freeze(load_folder(folder), bf16=True)
    assert next(frozen.parameters()).dtype == torch.bfloat16
    assert not any(p.requires_grad for p in frozen.parameters())
    ids, mask = left_padded([6, 12])
    full = response_forward(ours, ids, mask, start=4).logprobs
    half = response_forward(frozen, ids, mask, start=4).logprobs
    assert half.dtype == torch.float32
    assert (full - half)[mask[:, 4:]].abs().max() < 0.1


# what `rlhf export` may be asked to write, as (backbone, its config beyond the shared shape)
EXPORTED = {
    "gpt2": ("gpt", {}),
    "llama": ("llama", {"n_kv_head": 2}),
    "llama3": ("llama", {"n_kv_head": 2, "rope_original_max_len": 16}),
    # a pretrained Llama-3 cut to a block_size within the context it was pretrained on
    "llama3-cut": ("llama", {"n_kv_head": 2, "rope_original_max_len": 8192}),
    "qwen2": ("llama", {"n_kv_head": 2, "qkv_bias": True}),
    "qwen3": ("llama", {"n_kv_head": 2, "qk_norm": True, "head_dim": 16, "tie_embeddings": True}),
}


@pytest.fixture(scope="module")
def byte_tokenizer(tmp_path_factory) -> Tokenizer:
    return save_tokenizer(tmp_path_factory.mktemp("bytes"), "bytes")


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(f"{record.name}: {record.getMessage()}")


@contextmanager
def transformers_warnings() -> Iterator[list[str]]:
    """Every warning given inside the block, through the `warnings` module or transformers'
    loggers. Its once-only warnings are made to speak again: an earlier test (or a reference
    model built here) may already have had them said."""
    said: list[str] = []
    library = logging.getLogger("transformers")
    handler = _Collect(said)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_warning()
    logging.Logger.warning_once.cache_clear()
    library.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield said
        said.extend(f"{w.category.__name__}: {w.message}" for w in caught)
    finally:
        library.removeHandler(handler)
        transformers.logging.set_verbosity(verbosity)


@pytest.mark.parametrize("reward_model", [False, True], ids=["policy", "reward"])
@pytest.mark.parametrize("family", sorted(EXPORTED))
@torch.no_grad()
def test_an_export_loads_in_transformers_without_a_warning(
    family, reward_model, byte_tokenizer, tmp_path
):
    """What `rlhf export` writes loads (model, tokenizer, generation config) without a word
    from transformers, and gives our logits. GPT-2's config left `bos_token_id` to
    transformers' default 50256, outside our vocabulary; a Llama-3 cut to a block_size within
    its original context stated that block_size as max_position_embeddings, which Llama-3
    rope scaling must exceed."""
    name, extra = EXPORTED[family]
    shape = {"vocab_size": byte_tokenizer.vocab_size, "block_size": 64, "n_layer": 1,
             "n_head": 4, "n_embd": 64, "mlp_width": 96}  # fmt: skip
    torch.manual_seed(8)
    ours = build(name, shape | extra).eval()
    folder = save_folder(ours, tmp_path / "out", byte_tokenizer, reward_model=reward_model)
    auto = (
        transformers.AutoModelForSequenceClassification
        if reward_model
        else transformers.AutoModelForCausalLM
    )
    with transformers_warnings() as said:
        reloaded = auto.from_pretrained(folder).eval()
        transformers.AutoTokenizer.from_pretrained(folder)
        transformers.GenerationConfig.from_pretrained(folder)
    assert said == []
    ids = torch.randint(
        0, byte_tokenizer.eos_id, (2, 12), generator=torch.Generator().manual_seed(9)
    )
    logits = reloaded(input_ids=ids).logits
    if reward_model:  # the score at each row's last token; the fresh reward head has no bias
        logits, expected = logits[:, 0], ours.rewards(ours.hidden_states(ids))[:, -1]
    else:
        expected = ours(ids)
    assert (logits - expected).abs().max() <= 1e-5


@pytest.mark.parametrize(
    ("switches", "model_type", "attention_bias"),
    [
        ({}, "llama", False),
        ({"qkv_bias": True}, "qwen2", False),  # Qwen2 biases q, k and v without saying so
        ({"qk_norm": True}, "qwen3", False),
        ({"qk_norm": True, "qkv_bias": True}, "qwen3", True),  # only Qwen3 normalizes heads
    ],
)
def test_a_llama_family_model_is_written_as_the_family_that_holds_it(
    switches, model_type, attention_bias
):
    """The Llama backbone's Hugging Face families are one table (`llama/convert.py`): the
    model is written as the most specific family that can hold it, and reads back the same."""
    config = dataclasses.asdict(LlamaConfig(vocab_size=VOCAB, **switches))
    hf, _ = llama_convert.to_hf(config, {})
    assert (hf["model_type"], hf["attention_bias"]) == (model_type, attention_bias)
    assert registry.reading(model_type) is registry.family("llama")
    read = llama_convert.config_from_hf(hf)
    assert {k: read[k] for k in ("qkv_bias", "qk_norm")} == {
        k: config[k] for k in ("qkv_bias", "qk_norm")
    }
