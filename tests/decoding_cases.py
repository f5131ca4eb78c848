"""The models, prompts and sampling rules the decoding tests run on the CPU and on CUDA
(`tests/unit/sampling/test_decoding.py`, `tests/gpu/test_cuda.py`): rows that end at different
steps, a GPT, a Qwen3-shaped Llama and an adapted GPT."""

import torch

from rlhf.models.gpt import GPT, GPTConfig
from rlhf.models.llama import Llama, LlamaConfig
from rlhf.models.lora import LoRALinear, add_adapters
from rlhf.sampling.generate import generate
from rlhf.sampling.sampler import SamplingConfig
from rlhf.sampling.streams import RowStreams

EOS, PAD = 1, 2
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14], [20, 21, 22, 23]]
SAMPLINGS = {
    "whole distribution": SamplingConfig(max_new_tokens=128, temperature=1.3),
    "top-p": SamplingConfig(max_new_tokens=40, top_p=0.7),
    "top-k": SamplingConfig(max_new_tokens=40, top_k=8, top_p=0.9),
}


def gpt() -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=60, block_size=200, n_layer=2, n_head=2, n_embd=32))
    with torch.no_grad():  # a feature that favours the end token: rows end at different steps
        model.ln_f.bias[0] = 1.0
        model.lm_head.weight[EOS, 0] = 2.5
    return model.eval()


def qwen3() -> Llama:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=60, block_size=200, n_kv_head=2, head_dim=16, qk_norm=True)
    return Llama(config).eval()


def adapted(model):
    """`model` with LoRA adapters that change its answers (B drawn, not zero)."""
    add_adapters(model, rank=4, alpha=8.0)
    for layer in model.modules():
        if isinstance(layer, LoRALinear):
            torch.nn.init.normal_(layer.lora_b, std=0.1)
    return model


MODELS = {"gpt": gpt, "qwen3": qwen3, "gpt+lora": lambda: adapted(gpt())}


def decode(model, mode, config, monkeypatch, pad=PAD, prompts=PROMPTS, eos=EOS):
    monkeypatch.setenv("RLHF_DECODE", mode)
    streams = RowStreams(list(range(len(prompts))))
    return generate(model, prompts, eos_id=eos, pad_id=pad, config=config, generator=streams)
