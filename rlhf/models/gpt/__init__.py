"""GPT (GPT-2's layout): the backbone the embedded default trains from scratch, and GPT-2's
Hugging Face folders."""

from rlhf.models.family import Family
from rlhf.models.gpt import convert
from rlhf.models.gpt.model import GPT, GPTConfig

FAMILY = Family(GPT, {"gpt2": {}}, convert.config_from_hf, convert.weights_from_hf, convert.to_hf)

__all__ = ["FAMILY", "GPT", "GPTConfig"]
