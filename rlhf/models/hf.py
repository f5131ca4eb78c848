"""Hugging Face checkpoint folders into our backbones: `config.json` and safetensors weights.

A folder as `save_pretrained` writes it (or as downloaded from the Hub): `config.json`, then
`model.safetensors` or shards listed in `model.safetensors.index.json`. The config's
`model_type` picks the backbone family that reads it (`registry.py`: `gpt2` into GPT, `llama`,
`qwen2` and `qwen3` into the Llama-family backbone), whose `convert.py` maps the config and
the weights' names both ways. Weights come through safetensors
only, never a pickle. The value and reward heads, which a language model lacks, keep their
fresh initialization; every other parameter must come from the folder. A
`*ForSequenceClassification` folder with one label (a reward model trained elsewhere) loads
its score head as the reward head, and lacks the LM head.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from rlhf.atomic import atomic_path
from rlhf.data.tokenizer import Tokenizer, write_hf_tokenizer
from rlhf.errors import CheckpointError
from rlhf.models import registry
from rlhf.models.backbone import Backbone

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
GENERATION_FILE = "generation_config.json"
OWN_HEADS = ("value_head.", "reward_head.")  # ours, absent from a language model's folder
SCORE_WEIGHT = "score.weight"  # a sequence classifier's head: our reward head, without bias
# buffers old checkpoints saved that are recomputed here
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{folder}: no {CONFIG_FILE}; is it a Hugging Face model folder?")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc


def weight_files(folder: Path) -> list[Path]:
    """The safetensors file, or every shard the index names."""
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    index = folder / WEIGHTS_INDEX
    if not index.is_file():
        raise CheckpointError(
            f"{folder}: no {WEIGHTS_FILE} or {WEIGHTS_INDEX} (weights load from safetensors "
            "only; convert a pytorch_model.bin folder with save_pretrained first)"
        )
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: shards named in {WEIGHTS_INDEX} missing: {missing}")
    return [folder / s for s in shards]


def config_of(folder: Path, block_size: int | None = None) -> tuple[str, str, dict[str, Any]]:
    """(model_type, backbone name, its config) for the folder's model, or a CheckpointError
    naming what is unsupported; `block_size` cuts its context to that many tokens."""
    model_type, name, config = _converted_config(folder)
    if block_size is not None:
        if block_size > config["block_size"]:
            raise CheckpointError(
                f"{folder / CONFIG_FILE}: model.block_size = {block_size} exceeds the model's "
                f"context of {config['block_size']} tokens"
            )
        config["block_size"] = block_size
    return model_type, name, config


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


def check_sizes(path: Path, hf: dict[str, Any]) -> None:
    """Refuse, naming the key, a size in config.json (`path`) that is not a whole number
    within `SIZE_LIMITS`, or heads that do not divide what they split."""
    for key, limit in SIZE_LIMITS.items():
        value = hf.get(key)
        if key not in hf or (value is None and key in OPTIONAL_SIZES):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise CheckpointError(
                f"{path}: {key} = {value!r}; expected a whole number from 1 to {limit}"
            )
    for dividend, divisor in DIVISIBLE:
        if dividend == "hidden_size" and hf.get("head_dim"):
            continue  # Qwen3 sets the head width apart from the model's
        if hf.get(dividend) and hf.get(divisor) and hf[dividend] % hf[divisor]:
            raise CheckpointError(
                f"{path}: {dividend} = {hf[dividend]} is not a multiple of "
                f"{divisor} = {hf[divisor]}"
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
    `block_size` cuts its context (GPT-2 keeps that many position embeddings)."""
    folder = Path(folder)
    _, name, config = config_of(folder, block_size)
    state: dict[str, Tensor] = {}
    for file in weight_files(folder):
        state |= load_file(file)
    weights = registry.family(name).weights_from_hf(state)
    weights = {k: v.float() for k, v in weights.items() if not k.endswith(IGNORED_SUFFIXES)}
    if "wpe.weight" in weights:  # learned positions: the first block_size of them
        weights["wpe.weight"] = weights["wpe.weight"][: config["block_size"]]
    classifier = weights.pop(SCORE_WEIGHT, None)  # a *ForSequenceClassification reward model
    if classifier is not None:
        if classifier.shape[0] != 1:
            raise CheckpointError(
                f"{folder}: a sequence classifier with {classifier.shape[0]} labels; a reward "
                "model has one score"
            )
        weights["reward_head.weight"] = classifier
        weights["reward_head.bias"] = torch.zeros(1)
    model = registry.build(name, config)
    result = model.load_state_dict(weights, strict=False)
    tied = any(
        model.lm_head.weight is m.weight for m in model.modules() if isinstance(m, nn.Embedding)
    )  # the LM head is the embedding, which the folder holds once
    missing = [
        k
        for k in result.missing_keys
        if not k.startswith(OWN_HEADS)
        and not ((tied or classifier is not None) and k == "lm_head.weight")
    ]
    if missing or result.unexpected_keys:
        raise CheckpointError(
            f"{folder}: weights do not match its config.json: missing {missing[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )
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
