"""Hugging Face checkpoint folders into our backbones: `config.json` and safetensors weights.

A folder as `save_pretrained` writes it (or as downloaded from the Hub): `config.json`, then
`model.safetensors` or shards listed in `model.safetensors.index.json`. The config's
`model_type` picks the backbone family that reads it (`registry.py`: `gpt2` into GPT, `llama`,
`qwen2` and `qwen3` into the Llama-family backbone), whose `convert.py` maps the config and
the weights' names both ways. config.json's sizes and float settings are checked before
anything else is read; the weights come through safetensors only, never a pickle, each file
checked against its own bytes and the config before any model is built (`hf_weights.py`).
The value and reward heads, which a language model lacks, keep their fresh initialization;
every other parameter must come from the folder. A `*ForSequenceClassification` folder with
one label (a reward model trained elsewhere) loads its score head as the reward head, and
lacks the LM head.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from rlhf.atomic import atomic_path
from rlhf.errors import CheckpointError
from rlhf.models import registry
from rlhf.models.backbone import Backbone
from rlhf.models.hf_weights import OWN_HEADS, SCORE_WEIGHT, WEIGHTS_FILE, load_weights
from rlhf.tokenizer.tokenizer import Tokenizer, write_hf_tokenizer

CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"
MAX_CONFIG_BYTES = 10_000_000  # a config.json holds tens of settings: KBs


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{folder}: no {CONFIG_FILE}; is it a Hugging Face model folder?")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{path}: over {MAX_CONFIG_BYTES:,} bytes; not a model's config")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: not a JSON object of settings")
    return config


def config_of(folder: Path, block_size: int | None = None) -> tuple[str, str, dict[str, Any]]:
    """(model_type, backbone name, its config) for the folder's model, or a CheckpointError
    naming what is unsupported; `block_size` cuts its context to that many tokens."""
    model_type, name, config = _converted_config(folder)
    return model_type, name, _cut(folder, config, block_size)


def _cut(folder: Path, config: dict[str, Any], block_size: int | None) -> dict[str, Any]:
    """`config` with its context cut to `block_size` tokens (None: as it is)."""
    if block_size is None:
        return config
    if block_size > config["block_size"]:
        raise CheckpointError(
            f"{folder / CONFIG_FILE}: model.block_size = {block_size} exceeds the model's "
            f"context of {config['block_size']} tokens"
        )
    return config | {"block_size": block_size}


# The config.json keys that size a model (GPT-2's and the Llama family's names; a family that
# names its sizes otherwise adds its keys), and a bound no real model reaches: a whole number
# from 1 to the bound, checked before anything is built, so a broken or hostile file (a
# billion layers, a negative width) is one line naming the key, not a hang or a traceback.
SIZE_LIMITS = {
    "vocab_size": 2**22, "n_positions": 2**21, "max_position_embeddings": 2**21,
    "n_layer": 1024, "num_hidden_layers": 1024, "n_head": 1024, "num_attention_heads": 1024,
    "num_key_value_heads": 1024, "n_embd": 2**16, "hidden_size": 2**16, "n_inner": 2**20,
    "intermediate_size": 2**20, "head_dim": 2**12,
}  # fmt: skip
OPTIONAL_SIZES = ("n_inner", "num_key_value_heads", "head_dim")  # null means the default
# (dividend, divisor): heads split the width (when no head_dim is given), query heads share
# key/value heads in whole groups
DIVISIBLE = (
    ("n_embd", "n_head"),
    ("hidden_size", "num_attention_heads"),
    ("num_attention_heads", "num_key_value_heads"),
)


def _check_size(path: Path, key: str, value: object, limit: int) -> None:
    """Refuse `value` unless it is a whole number from 1 to `limit` (a bool is no number)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise CheckpointError(
            f"{path}: {key} = {value!r}; expected a whole number from 1 to {limit}"
        )


def check_sizes(path: Path, hf: dict[str, Any]) -> None:
    """Refuse, naming the key, a size in config.json (`path`) that is not a whole number
    within `SIZE_LIMITS`, or heads that do not divide what they split."""
    for key, limit in SIZE_LIMITS.items():
        value = hf.get(key)
        if key not in hf or (value is None and key in OPTIONAL_SIZES):
            continue
        _check_size(path, key, value, limit)
    for dividend, divisor in DIVISIBLE:
        if dividend == "hidden_size" and hf.get("head_dim"):
            continue  # Qwen3 sets the head width apart from the model's
        if hf.get(dividend) and hf.get(divisor) and hf[dividend] % hf[divisor]:
            raise CheckpointError(
                f"{path}: {dividend} = {hf[dividend]} is not a multiple of "
                f"{divisor} = {hf[divisor]}"
            )


# config.json's float settings the backbones read, by where they are (rope settings nest in
# rope_parameters or rope_scaling; transformers writes both), with a range every real model
# is within (Llama-3 and Qwen: eps 1e-5 or 1e-6, theta 1e4 to 1e6, factor 8 to 32, low and
# high frequency factors 1 and 4). A value out of range or not finite (an epsilon of NaN) is
# one line at load, as a size is, not a NaN loss after the model was built and the data read.
FLOAT_LIMITS = {"rms_norm_eps": (1e-30, 0.1), "rope_theta": (1.0, 1e12)}
ROPE_GROUPS = ("rope_parameters", "rope_scaling")
ROPE_FLOAT_LIMITS = {"rope_theta": (1.0, 1e12), "factor": (1.0, 1024.0),
                     "low_freq_factor": (1e-3, 1e3), "high_freq_factor": (1e-3, 1e3)}  # fmt: skip
ROPE_SIZES = {"original_max_position_embeddings": 2**21}


def check_values(path: Path, hf: dict[str, Any]) -> None:
    """Refuse, naming the key, a float setting in config.json (`path`) that is not a finite
    number within `FLOAT_LIMITS` (`ROPE_FLOAT_LIMITS` in a rope group), a rope group's size
    that is not a whole number, or Llama-3 frequency factors whose difference, which the
    scaling divides by, is not positive."""
    groups = [("", hf, FLOAT_LIMITS)] + [
        (f"{group}.", hf[group], ROPE_FLOAT_LIMITS)
        for group in ROPE_GROUPS
        if isinstance(hf.get(group), dict)
    ]
    for prefix, settings, limits in groups:
        for key, (low, high) in limits.items():
            value = settings.get(key)
            if key in settings and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not low <= value <= high
            ):
                raise CheckpointError(
                    f"{path}: {prefix}{key} = {value!r}; expected a number from {low:g} to {high:g}"
                )
        for key, limit in ROPE_SIZES.items():
            if prefix and key in settings:
                _check_size(path, prefix + key, settings[key], limit)
        low_freq, high_freq = settings.get("low_freq_factor"), settings.get("high_freq_factor")
        if prefix and low_freq is not None and high_freq is not None and high_freq <= low_freq:
            raise CheckpointError(
                f"{path}: {prefix}high_freq_factor = {high_freq!r} must exceed low_freq_factor = "
                f"{low_freq!r}: Llama-3 rope scaling divides by their difference"
            )


def _converted_config(folder: Path) -> tuple[str, str, dict[str, Any]]:
    hf = read_config(folder)
    model_type = hf.get("model_type")
    family = registry.reading(model_type)
    if family is None:
        raise CheckpointError(
            f"{folder / CONFIG_FILE}: model_type {model_type!r} is not supported; "
            f"supported: {', '.join(registry.model_types())}"
        )
    check_sizes(folder / CONFIG_FILE, hf)
    check_values(folder / CONFIG_FILE, hf)
    try:
        return model_type, family.model.name, family.config_from_hf(hf)
    except (KeyError, ValueError) as exc:
        raise CheckpointError(
            f"{folder / CONFIG_FILE}: unsupported or missing {exc} for {model_type}"
        ) from exc


def load_folder(
    folder: str | Path, device: torch.device | str = "cpu", block_size: int | None = None
) -> Backbone:
    """The folder's model as a backbone, in float32, with fresh value and reward heads;
    `block_size` cuts its context (GPT-2 keeps that many position embeddings). The weights
    are checked to be exactly the model's (`hf_weights.py`) before it is built, so the
    parameters they leave unset are the heads a language model lacks."""
    folder = Path(folder)
    _, name, full = _converted_config(folder)
    config = _cut(folder, full, block_size)
    weights = load_weights(folder, name, full)
    if "wpe.weight" in weights:  # learned positions: the first block_size of them
        weights["wpe.weight"] = weights["wpe.weight"][: config["block_size"]]
    model = registry.build(name, config)
    model.load_state_dict(weights, strict=False)
    return model.to(device)


def token_ids(tokenizer: Tokenizer | None) -> dict[str, int | None]:
    """The special-token ids for config.json, every one stated (null where there is none):
    one left out takes transformers' default for the family (GPT-2's 50256, Llama's 1 and 2),
    a token of another vocabulary, which it warns about when outside ours. The pipeline puts
    no BOS of its own; a chat template's is part of the frame the template writes."""
    return {
        "bos_token_id": None,
        "eos_token_id": None if tokenizer is None else tokenizer.eos_id,
        "pad_token_id": None if tokenizer is None else tokenizer.pad_id,
    }


def save_folder(
    model: Backbone,
    folder: str | Path,
    tokenizer: Tokenizer | None = None,
    reward_model: bool = False,
) -> Path:
    """Write `model` as a Hugging Face folder (config.json, model.safetensors) that
    transformers and vLLM load as a causal LM, or with `reward_model` as a one-label
    `*ForSequenceClassification` whose score head is our reward head (its bias, a constant
    offset, dropped); the value head stays behind. With `tokenizer`, its files and chat
    template go in too, and the end and pad tokens into the config and
    generation_config.json, so generation stops where the pipeline's answers end. The folder
    loads in transformers without a warning. `folder` must not exist yet; it is written
    beside and renamed into place."""
    config = dataclasses.asdict(model.config)
    state = {
        name: tensor.detach().cpu().float().contiguous()
        for name, tensor in model.state_dict().items()
        if not name.startswith(OWN_HEADS)
    }
    hf, weights = registry.family(model.name).to_hf(config, state)
    if reward_model:
        weights.pop("lm_head.weight", None)
        weights[SCORE_WEIGHT] = model.reward_head.weight.detach().cpu().float().contiguous()
        family = hf["architectures"][0].removesuffix("LMHeadModel").removesuffix("ForCausalLM")
        hf["architectures"] = [family + "ForSequenceClassification"]
        hf |= {"num_labels": 1, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}
    tokens = token_ids(tokenizer)
    hf |= {"torch_dtype": "float32"} | tokens
    with atomic_path(folder) as tmp:
        tmp.mkdir()
        if tokenizer is not None:
            (tmp / GENERATION_FILE).write_text(json.dumps(tokens, indent=2) + "\n")
            write_hf_tokenizer(tokenizer, tmp)
        (tmp / CONFIG_FILE).write_text(json.dumps(hf, indent=2) + "\n")
        save_file(
            {k: v.contiguous() for k, v in weights.items()},
            tmp / WEIGHTS_FILE,
            metadata={"format": "pt"},
        )
    return Path(folder)
