"""Llama-family Hugging Face folders (Llama-3.x, Qwen2/Qwen2.5, Qwen3) to and from our Llama
backbone: config.json's fields, by family, and the weights' names (the same as ours under
`model.`)."""

from __future__ import annotations

from typing import Any

from rlhf.models.family import State

# The Hugging Face families this backbone reads and writes, each with its class name and the
# switches its model_type implies beyond what config.json states. Another family of the same
# architecture is one entry here.
HF_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"architecture": "LlamaForCausalLM"},
    "qwen2": {"architecture": "Qwen2ForCausalLM", "qkv_bias": True},  # q, k, v always biased
    "qwen3": {"architecture": "Qwen3ForCausalLM", "qk_norm": True},
}


UNSTATED = ("qk_norm",)  # switches config.json cannot state: only a model_type implies them


def implied(model_type: str) -> dict[str, bool]:
    """The switches `model_type` implies (`qkv_bias`, `qk_norm`)."""
    return {k: v for k, v in HF_FAMILIES[model_type].items() if k != "architecture"}


def expresses(model_type: str, config: dict[str, Any]) -> bool:
    """Whether a folder of `model_type` can hold a model of our `config`: it has every switch
    the family implies, and those config.json cannot state only where the family implies them."""
    switches = implied(model_type)
    return all(config[k] == v for k, v in switches.items()) and all(
        config[k] == switches.get(k, False) for k in UNSTATED
    )


def config_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
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
        # Llama and Qwen3 say so in attention_bias; Qwen2 always biases q, k and v
        "qkv_bias": bool(hf.get("attention_bias")),
        "qk_norm": False,
        "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
    }
    config |= implied(hf["model_type"])
    if kind == "llama3":
        config |= {
            "rope_original_max_len": rope["original_max_position_embeddings"],
            "rope_factor": rope["factor"],
            "rope_low_freq_factor": rope["low_freq_factor"],
            "rope_high_freq_factor": rope["high_freq_factor"],
        }
    return config


def weights_from_hf(state: State) -> State:
    return {name.removeprefix("model."): tensor for name, tensor in state.items()}


def context_length(config: dict[str, Any]) -> int:
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


def to_hf(config: dict[str, Any], state: State) -> tuple[dict[str, Any], State]:
    """As the most specific family that can hold the model (Qwen3 where heads are
    normalized, Qwen2 where q/k/v have biases, else Llama)."""
    fitting = [t for t in HF_FAMILIES if expresses(t, config)]
    if not fitting:
        raise ValueError(f"no Hugging Face family of {list(HF_FAMILIES)} holds this model")
    model_type = max(fitting, key=lambda t: len(implied(t)))
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    if config["rope_original_max_len"]:
        rope |= {
            "rope_type": "llama3",
            "original_max_position_embeddings": config["rope_original_max_len"],
            "factor": config["rope_factor"],
            "low_freq_factor": config["rope_low_freq_factor"],
            "high_freq_factor": config["rope_high_freq_factor"],
        }
    architecture = HF_FAMILIES[model_type]["architecture"]
    hf = {
        "architectures": [architecture], "model_type": model_type,
        "vocab_size": config["vocab_size"], "max_position_embeddings": context_length(config),
        "num_hidden_layers": config["n_layer"], "num_attention_heads": config["n_head"],
        "num_key_value_heads": config["n_kv_head"], "hidden_size": config["n_embd"],
        "intermediate_size": config["mlp_width"],
        "head_dim": config["head_dim"] or config["n_embd"] // config["n_head"],
        "rms_norm_eps": config["norm_eps"], "hidden_act": "silu",
        "attention_bias": config["qkv_bias"] and not implied(model_type).get("qkv_bias"),
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
