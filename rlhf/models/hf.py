"""Hugging Face checkpoint folders into our backbones: `config.json` and safetensors weights.

A folder as `save_pretrained` writes it (or as downloaded from the Hub): `config.json`, then
`model.safetensors` or shards listed in `model.safetensors.index.json`. The config's
`model_type` picks the backbone: `gpt2` loads into GPT (whose module names are GPT-2's),
`llama`, `qwen2` and `qwen3` into the Llama-family backbone. Weights come through safetensors
only, never a pickle. The value and reward heads, which a language model lacks, keep their
fresh initialization; every other parameter must come from the folder. A
`*ForSequenceClassification` folder with one label (a reward model trained elsewhere) loads
its score head as the reward head, and lacks the LM head.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from rlhf.atomic import atomic_path
from rlhf.data.tokenizer import Tokenizer, write_hf_tokenizer
from rlhf.errors import CheckpointError
from rlhf.models.backbone import Backbone
from rlhf.models.registry import build

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
GENERATION_FILE = "generation_config.json"
OWN_HEADS = ("value_head.", "reward_head.")  # ours, absent from a language model's folder
SCORE_WEIGHT = "score.weight"  # a sequence classifier's head: our reward head, without bias
# buffers old checkpoints saved that are recomputed here
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")
GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")

Converted = tuple[str, dict[str, Any]]  # (backbone name, its config)


GPT2_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}  # HF -> ours


def gpt2_config(hf: dict[str, Any]) -> Converted:
    activation = hf.get("activation_function", "gelu_new")
    if activation not in GPT2_GELU:
        raise ValueError(f"activation_function {activation!r}")
    return "gpt", {
        "vocab_size": hf["vocab_size"],
        "block_size": hf["n_positions"],
        "n_layer": hf["n_layer"],
        "n_head": hf["n_head"],
        "n_embd": hf["n_embd"],
        "mlp_width": hf.get("n_inner") or 0,
        "bias": True,
        "gelu": GPT2_GELU[activation],
    }


def gpt2_weights(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """GPT-2's names without the `transformer.` prefix and with `h.` as `blocks.`; its
    Conv1D layers store weights [in, out], transposed from nn.Linear's."""
    out = {}
    for name, tensor in state.items():
        name = name.removeprefix("transformer.")
        if name.startswith("h."):
            name = "blocks." + name.removeprefix("h.")
        out[name] = tensor.t() if name.endswith(GPT2_CONV1D) else tensor
    return out


def llama_config(hf: dict[str, Any]) -> Converted:
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "llama3"):
        raise ValueError(f"rope type {kind!r} (default and llama3 are supported)")
    if hf.get("use_sliding_window"):
        raise ValueError("use_sliding_window: true")
    if hf.get("hidden_act", "silu") != "silu" or hf.get("mlp_bias"):
        raise ValueError(f"hidden_act {hf.get('hidden_act')!r} or mlp_bias")
    config = {
        "vocab_size": hf["vocab_size"],
        "block_size": hf["max_position_embeddings"],
        "n_layer": hf["num_hidden_layers"],
        "n_head": hf["num_attention_heads"],
        "n_kv_head": hf.get("num_key_value_heads") or hf["num_attention_heads"],
        "n_embd": hf["hidden_size"],
        "mlp_width": hf["intermediate_size"],
        "head_dim": hf.get("head_dim") or 0,
        "norm_eps": hf.get("rms_norm_eps", 1e-6),
        "rope_theta": rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
        # Qwen2 always biases q, k and v; Llama and Qwen3 say so in attention_bias
        "qkv_bias": hf["model_type"] == "qwen2" or bool(hf.get("attention_bias")),
        "qk_norm": hf["model_type"] == "qwen3",
        "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
    }
    if kind == "llama3":
        config |= {
            "rope_original_max_len": rope["original_max_position_embeddings"],
            "rope_factor": rope["factor"],
            "rope_low_freq_factor": rope["low_freq_factor"],
            "rope_high_freq_factor": rope["high_freq_factor"],
        }
    return "llama", config


def llama_weights(state: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name.removeprefix("model."): tensor for name, tensor in state.items()}


FAMILIES: dict[str, tuple[Callable[[dict[str, Any]], Converted], Callable[..., dict]]] = {
    "gpt2": (gpt2_config, gpt2_weights),
    "llama": (llama_config, llama_weights),
    "qwen2": (llama_config, llama_weights),
    "qwen3": (llama_config, llama_weights),
}


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


# The config.json keys that size a model, and a bound no real model reaches: a whole number
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
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"{folder / CONFIG_FILE}: model_type {model_type!r} is not supported; "
            f"supported: {', '.join(FAMILIES)}"
        )
    check_sizes(folder / CONFIG_FILE, hf)
    try:
        return model_type, *FAMILIES[model_type][0](hf)
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
    model_type, name, config = config_of(folder, block_size)
    state: dict[str, Tensor] = {}
    for file in weight_files(folder):
        state |= load_file(file)
    weights = FAMILIES[model_type][1](state)
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
    model = build(name, config)
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


# -- export ---------------------------------------------------------------------------------
def gpt2_export(config: dict[str, Any], state: dict[str, Tensor]) -> tuple[dict, dict]:
    if not config["bias"]:
        raise ValueError("GPT-2 has biases everywhere; this model was trained with bias: false")
    hf = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": config["vocab_size"], "n_positions": config["block_size"],
        "n_layer": config["n_layer"], "n_head": config["n_head"], "n_embd": config["n_embd"],
        "n_inner": config["mlp_width"] or None, "layer_norm_epsilon": 1e-5,
        "activation_function": {v: k for k, v in GPT2_GELU.items()}[config["gelu"]],
        "tie_word_embeddings": True,
    }  # fmt: skip
    weights = {}
    for name, tensor in state.items():
        if name == "lm_head.weight":
            continue  # tied to wte
        if name.endswith(GPT2_CONV1D):
            tensor = tensor.t()
        if name.startswith("blocks."):
            name = "h." + name.removeprefix("blocks.")
        weights["transformer." + name] = tensor
    return hf, weights


def llama_context(config: dict[str, Any]) -> int:
    """max_position_embeddings: the block_size, unless Llama-3 rope scaling stretches an
    original context the block_size is within (a pretrained Llama-3 cut to a short
    `model.block_size`), which transformers warns about; then original x factor, the most
    the scaling stretches it to (Meta's Llama-3.2 configs state less: 131,072 where 8,192 x 32
    is 262,144). The frequencies depend on the original context alone, so the logits are the
    same either way, and the pipeline cuts the context to `model.block_size` again when it
    loads the folder."""
    original = config["rope_original_max_len"]
    if not original or config["block_size"] > original:
        return config["block_size"]
    return round(original * config["rope_factor"])


def llama_export(config: dict[str, Any], state: dict[str, Tensor]) -> tuple[dict, dict]:
    """As Qwen3 where heads are normalized, Qwen2 where q/k/v have biases, else Llama."""
    model_type = "qwen3" if config["qk_norm"] else "qwen2" if config["qkv_bias"] else "llama"
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    if config["rope_original_max_len"]:
        rope |= {
            "rope_type": "llama3",
            "original_max_position_embeddings": config["rope_original_max_len"],
            "factor": config["rope_factor"],
            "low_freq_factor": config["rope_low_freq_factor"],
            "high_freq_factor": config["rope_high_freq_factor"],
        }
    architecture = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                    "qwen3": "Qwen3ForCausalLM"}[model_type]  # fmt: skip
    hf = {
        "architectures": [architecture], "model_type": model_type,
        "vocab_size": config["vocab_size"], "max_position_embeddings": llama_context(config),
        "num_hidden_layers": config["n_layer"], "num_attention_heads": config["n_head"],
        "num_key_value_heads": config["n_kv_head"], "hidden_size": config["n_embd"],
        "intermediate_size": config["mlp_width"],
        "head_dim": config["head_dim"] or config["n_embd"] // config["n_head"],
        "rms_norm_eps": config["norm_eps"], "hidden_act": "silu",
        "attention_bias": config["qkv_bias"] and model_type != "qwen2",
        "tie_word_embeddings": config["tie_embeddings"],
        "rope_parameters": rope, "rope_theta": config["rope_theta"],
        "rope_scaling": rope if config["rope_original_max_len"] else None,
    }  # fmt: skip
    weights = {
        name if name == "lm_head.weight" else "model." + name: tensor
        for name, tensor in state.items()
        if not (config["tie_embeddings"] and name == "lm_head.weight")
    }
    return hf, weights


EXPORTERS = {"gpt": gpt2_export, "llama": llama_export}


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
    hf, weights = EXPORTERS[model.name](config, state)
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
        save_file({k: v.contiguous() for k, v in weights.items()}, tmp / WEIGHTS_FILE,
                  metadata={"format": "pt"})  # fmt: skip
    return Path(folder)
