"""GPT-2's Hugging Face folders (`model_type: gpt2`) to and from our GPT: config.json's fields
and the weights' names (GPT-2's Conv1D layers store their weights transposed)."""

from __future__ import annotations

from typing import Any

from rlhf.models.family import State

GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GPT2_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}  # HF -> ours


def config_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    activation = hf.get("activation_function", "gelu_new")
    if activation not in GPT2_GELU:
        raise ValueError(f"activation_function {activation!r}")
    return {
        "vocab_size": hf["vocab_size"],
        "block_size": hf["n_positions"],
        "n_layer": hf["n_layer"],
        "n_head": hf["n_head"],
        "n_embd": hf["n_embd"],
        "mlp_width": hf.get("n_inner") or 0,
        "bias": True,
        "gelu": GPT2_GELU[activation],
    }


def weights_from_hf(state: State) -> State:
    """GPT-2's names without the `transformer.` prefix and with `h.` as `blocks.`; its
    Conv1D layers store weights [in, out], transposed from nn.Linear's."""
    out = {}
    for name, tensor in state.items():
        name = name.removeprefix("transformer.")
        if name.startswith("h."):
            name = "blocks." + name.removeprefix("h.")
        out[name] = tensor.t() if name.endswith(GPT2_CONV1D) else tensor
    return out


def to_hf(config: dict[str, Any], state: State) -> tuple[dict[str, Any], State]:
    """GPT-2's config.json and weights: `h.` blocks under `transformer.`, Conv1D weights
    transposed back, the LM head left out (tied to the embedding)."""
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
