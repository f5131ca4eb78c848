"""Pretrained backbones: load time and peak memory of Hugging Face folders, and the memory
each stage needs for GPT-2 124M and Qwen3-0.6B, estimated and measured.

Part one saves tiny random models of each family with transformers' `save_pretrained` and
times `rlhf.models.hf.load_folder` on them (best of 3), with their float32 weights and the
process's peak resident memory. Part two is the memory preflight's estimate
(`rlhf.train.memory`, built on the meta device, nothing allocated) of what each stage holds
at once for the two real configurations at a 1,024-token context, plain and with both
`memory.activation_checkpointing` and `memory.frozen_bf16` on; the workloads are those the
stages declare, at GPU-sized batches. Part three measures what the estimate predicts: each
real configuration (random weights) takes two eager SFT steps (AdamW, the stages' chunked LM
loss, bf16 autocast on CUDA), plain and checkpointed, and samples a batch that fills its
context (frozen, in bfloat16 on CUDA as `memory.frozen_bf16` holds it), each in a fresh
process; the measured peak, above what the process held before building the model, is set
beside the estimate of the same workload. A GPU measures the stages' own batches at 1,024
tokens (peak reserved by torch's caching allocator, the CUDA context aside); a CPU, to stay
within minutes, smaller ones at 256 (peak resident memory: what the kernel's OOM killer
counts).

    python benchmarks/pretrained.py [--device cpu|cuda] [--threads 2]
        [--out benchmarks/results/pretrained.json]
"""

from __future__ import annotations

import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TypedDict

import torch
import transformers
from common import DEVICE_OPTION, device_name, setup, synchronize, write_result

from rlhf.algorithms.sft import masked_lm_loss
from rlhf.models.backbone import Backbone, freeze
from rlhf.models.hf import load_folder
from rlhf.models.registry import build
from rlhf.sampling.generate import generate
from rlhf.sampling.sampler import SamplingConfig
from rlhf.train.device import autocast
from rlhf.train.memory import GIB, Workload, estimate_bytes
from rlhf.train.optim import adamw

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


# part three, per device: (context, sequences of one SFT step, sequences sampled at once)
MEASURED_SIZES = {"cuda": (1024, 8, 64), "cpu": (256, 2, 8)}
# AdamW makes its moments in the first step's update: the second step's forward and backward
# are the first to run beside them
TRAIN_STEPS = 2
WARM_UP = {"n_layer": 1, "vocab_size": 256, "block_size": 16}  # the warm-up run's model


def load_figures(folder: Path) -> dict[str, float]:
    """Best-of-3 load seconds and the loaded weights in MiB."""
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        model = load_folder(folder)
        seconds.append(time.perf_counter() - started)
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return {"load_s": round(min(seconds), 4), "weights_mib": round(weights / 2**20, 2)}


def measured_workloads(device: torch.device) -> dict[str, Workload]:
    """What part three runs, as the estimate's workloads: an SFT step plain and checkpointed,
    and one batch sampled by a frozen model."""
    _, sequences, sampled = MEASURED_SIZES[device.type]
    return {
        "sft step": Workload(sequences=sequences),
        "sft step, checkpointed": Workload(sequences=sequences, checkpointed=True),
        "sampling": Workload(
            trained=0, frozen=1, sampled=sampled, frozen_bf16=device.type == "cuda"
        ),
    }


class Peak(TypedDict):
    measured_gib: float
    estimate_gib: float
    measured_of_estimate: float  # unrounded: the target compares it with 1


def reset_resident_peak() -> int:
    """Restart the kernel's count of this process's peak resident memory (VmHWM; a spawned
    child's `ru_maxrss` starts at its parent's peak) and return the resident bytes now."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_bytes("VmRSS")


def status_bytes(field: str) -> int:
    """A memory figure of /proc/self/status (Linux), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def run_workload(
    backbone: str, config: dict[str, Any], work: Workload, device_type: str, threads: int
) -> int:
    """Peak bytes `work` takes with a random `backbone` on the device, measured in this
    (fresh) process above what it held before building the model: on CUDA the caching
    allocator's peak reservation, on the CPU the peak resident memory. A one-block model
    with a small vocabulary runs `work` first, so that the libraries' lazy setup (kernel
    libraries, thread pools, autograd's engine) is not counted as the workload's."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    device = torch.device(device_type)
    run_on(build(backbone, {**config, **WARM_UP}).to(device), work)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_reserved(device)
    else:
        before = reset_resident_peak()
    run_on(build(backbone, config).to(device), work)
    synchronize(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device) - before
    return status_bytes("VmHWM") - before


def run_on(model: Backbone, work: Workload) -> None:
    if work.trained:
        train_steps(model, work)
    else:
        sample_batch(freeze(model, work.frozen_bf16), work.sampled)


def train_steps(model: Backbone, work: Workload) -> None:
    """TRAIN_STEPS SFT steps on random full-context sequences, eager (the stages compile the
    blocks on CUDA, which this leaves out)."""
    device = next(model.parameters()).device
    model.activation_checkpointing = work.checkpointed
    optimizer = adamw(model, lr=1e-5, weight_decay=0.1, betas=(0.9, 0.95))
    shape = (work.sequences, model.max_seq_len)
    tokens = torch.randint(model.config.vocab_size, shape, device=device)
    for _ in range(TRAIN_STEPS):
        with autocast(device, True):
            loss = masked_lm_loss(model, tokens, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        del loss  # as a training loop's step ends: its graph goes before the next forward


def sample_batch(model: Backbone, rows: int) -> None:
    """One batch of half-context prompts, every row answered up to the context (no end
    token: nothing stops early)."""
    half = model.max_seq_len // 2
    prompts = torch.randint(model.config.vocab_size, (rows, half)).tolist()
    sampling = SamplingConfig(max_new_tokens=model.max_seq_len - half)
    with autocast(next(model.parameters()).device, True):
        generate(model, prompts, eos_id=-1, pad_id=0, config=sampling)


def measured_peaks(device: torch.device, threads: int) -> dict[str, dict[str, Peak]]:
    """Part three: each real configuration's workloads run in fresh processes, their peak
    beside the estimate (GiB, and the measurement's share of it)."""
    context = MEASURED_SIZES[device.type][0]
    spawn = get_context("spawn")
    peaks: dict[str, dict[str, Peak]] = {}
    for name, (backbone, config) in REAL.items():
        config = {**config, "block_size": context}
        peaks[name] = {}
        for what, work in measured_workloads(device).items():
            with ProcessPoolExecutor(1, mp_context=spawn) as fresh:
                args = (backbone, config, work, device.type, threads)
                measured = fresh.submit(run_workload, *args).result()
            estimate = estimate_bytes(backbone, config, work)
            peaks[name][what] = Peak(
                measured_gib=round(measured / GIB, 2),
                estimate_gib=round(estimate / GIB, 2),
                measured_of_estimate=measured / estimate,
            )
    return peaks


def print_peaks(peaks: dict[str, dict[str, Peak]], device: torch.device) -> None:
    """Part three's table, GiB measured / estimated, and the target's verdict."""
    context, sequences, sampled = MEASURED_SIZES[device.type]
    sizes = f"{context}-token context ({sequences} sequences a step, {sampled} sampled)"
    print(f"\nmeasured on {device_name(device)} at a {sizes}: GiB measured / estimated")
    workloads = measured_workloads(device)
    print(f"{'model':<12}" + "".join(f"{w:>26}" for w in workloads))
    for name, rows in peaks.items():
        cells = [f"{r['measured_gib']:.2f} / {r['estimate_gib']:.2f}" for r in rows.values()]
        print(f"{name:<12}" + "".join(f"{c:>26}" for c in cells))
    highest = max(r["measured_of_estimate"] for rows in peaks.values() for r in rows.values())
    verdict = "met" if highest <= 1 else "NOT met"
    print(f"target: every estimate at or above its measured peak: {verdict} ({highest:.3f})")


def main() -> None:
    args = setup(__doc__, "pretrained", DEVICE_OPTION)
    device = torch.device(args.device)
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
    peaks = measured_peaks(device, args.threads)
    print_peaks(peaks, device)
    context, sequences, sampled = MEASURED_SIZES[device.type]
    write_result(
        args.out,
        {
            "tiny_loads": loads,
            "max_rss_mib": max_rss_mib,
            "context": CONTEXT,
            "memory": memory,
            "measured": {
                "device": device_name(device),
                "context": context,
                "sequences": sequences,
                "sampled": sampled,
                "peaks": peaks,
            },
        },
    )


if __name__ == "__main__":
    main()
