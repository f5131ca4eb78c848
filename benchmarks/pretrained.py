"""Pretrained backbones: load time and peak memory of Hugging Face folders, and the memory
each stage needs for GPT-2 124M and Qwen3-0.6B on one GPU.

Part one saves tiny random models of each family with transformers' `save_pretrained` and
times `rlhf.models.hf.load_folder` on them (best of 3), with their float32 weights and the
process's peak resident memory. Part two is the memory preflight's estimate
(`rlhf.train.memory`, built on the meta device, nothing allocated) of what each stage holds
at once for the two real configurations at a 1,024-token context, plain and with both
`memory.activation_checkpointing` and `memory.frozen_bf16` on; the workloads are those the
stages declare, at GPU-sized batches.

    python benchmarks/pretrained.py [--threads 2] [--out benchmarks/results/pretrained.json]
"""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path

import transformers
from common import setup, write_result

from rlhf.models.hf import load_folder
from rlhf.train.memory import GIB, Workload, estimate_bytes

TINY_SHAPE = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
TINY = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4)
    ),
    "llama3": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_SHAPE)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**TINY_SHAPE)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(**TINY_SHAPE, head_dim=32, tie_word_embeddings=True)
    ),
}
CONTEXT = 1024
REAL = {  # the published configurations, as hf.config_of converts them, cut to CONTEXT
    "GPT-2 124M": ("gpt", {"vocab_size": 50257, "block_size": CONTEXT, "n_layer": 12,
                           "n_head": 12, "n_embd": 768, "gelu": "tanh"}),
    "Qwen3-0.6B": ("llama", {"vocab_size": 151936, "block_size": CONTEXT, "n_layer": 28,
                             "n_head": 16, "n_kv_head": 8, "n_embd": 1024, "mlp_width": 3072,
                             "head_dim": 128, "rope_theta": 1000000.0, "qk_norm": True,
                             "tie_embeddings": True}),
}  # fmt: skip
# what each stage holds at once (as its module declares), at GPU-sized batches: SFT 8
# sequences; RM and DPO 4 prompts of up to 4 answers; PPO a minibatch of 8 with a separate
# critic, the reference and the reward model frozen, 64 answers sampled; evaluation three
# frozen models sampling 64 answers
STAGES = {
    "sft": {"sequences": 8, "sampled": 64},
    "collect": {"trained": 0, "frozen": 1, "sampled": 64},
    "rm": {"sequences": 16},
    "dpo": {"sequences": 16},
    "ppo": {"trained": 2, "frozen": 2, "sequences": 8, "sampled": 64},
    "evaluate": {"trained": 0, "frozen": 3, "sampled": 64},
}


def load_figures(folder: Path) -> dict[str, float]:
    """Best-of-3 load seconds and the loaded weights in MiB."""
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        model = load_folder(folder)
        seconds.append(time.perf_counter() - started)
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return {"load_s": round(min(seconds), 4), "weights_mib": round(weights / 2**20, 2)}


def main() -> None:
    args = setup(__doc__, "pretrained")
    loads = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family, make in TINY.items():
            model = make()
            model.save_pretrained(Path(tmp) / family)
            params = sum(p.numel() for p in model.parameters())
            loads[family] = {"params": params, **load_figures(Path(tmp) / family)}
    max_rss_mib = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(f"{'tiny folder':<12} {'params':>8} {'load s':>8} {'weights MiB':>12}")
    for family, row in loads.items():
        print(f"{family:<12} {row['params']:>8} {row['load_s']:>8} {row['weights_mib']:>12}")
    print(f"process peak resident memory: {max_rss_mib} MiB (torch and transformers included)")

    memory = {}
    print(f"\nGiB per stage at a {CONTEXT}-token context (plain / checkpointing + frozen bf16)")
    print(f"{'model':<12}" + "".join(f"{s:>16}" for s in STAGES))
    for name, (backbone, config) in REAL.items():
        memory[name] = {}
        for stage, counts in STAGES.items():
            plain = estimate_bytes(backbone, config, Workload(**counts)) / GIB
            saved = Workload(**counts, checkpointed=True, frozen_bf16=True)
            lean = estimate_bytes(backbone, config, saved) / GIB
            memory[name][stage] = {"plain_gib": round(plain, 1), "saving_gib": round(lean, 1)}
        print(f"{name:<12}" + "".join(
            f"{r['plain_gib']:>8.1f} /{r['saving_gib']:>6.1f}" for r in memory[name].values()
        ))  # fmt: skip
    write_result(
        args.out,
        {"tiny_loads": loads, "max_rss_mib": max_rss_mib, "context": CONTEXT, "memory": memory},
    )


if __name__ == "__main__":
    main()
