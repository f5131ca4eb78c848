"""The Llama-family backbone (Llama-3.x, Qwen2/Qwen2.5, Qwen3) and their Hugging Face
folders."""

from rlhf.models.family import Family
from rlhf.models.llama import convert
from rlhf.models.llama.model import Llama, LlamaConfig

FAMILY = Family(
    Llama, convert.HF_FAMILIES, convert.config_from_hf, convert.weights_from_hf, convert.to_hf
)

__all__ = ["FAMILY", "Llama", "LlamaConfig"]
