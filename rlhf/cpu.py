"""The CPU a run's bytes depend on: outputs made on one reproduce byte for byte only on a CPU
with the same signature (docs/concepts.md, reproducibility guarantees)."""

from __future__ import annotations

import platform
from pathlib import Path

# /proc/cpuinfo flags of the instructions float kernels are built from (x86-64 names)
VECTOR_FLAGS = ("avx", "amx", "fma", "f16c", "sse4")


def cpu_signature() -> dict[str, str]:
    """What decides the last bits of a CPU run besides params, seed and threads: the processor
    (vendor and model, since MKL picks its kernels by vendor too), its vector instructions
    (AVX2 and AVX-512 kernels sum in different orders; two chips both named "AMD EPYC" can
    differ there) and which of them torch dispatches to, the machine and torch's version. Two
    runs with equal signatures write the same bytes."""
    import torch  # here, so that what only names the committed CPU (rlhf.project) loads no torch

    info: dict[str, str] = {}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():  # Linux; elsewhere platform.processor() names the CPU
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    vector = sorted(f for f in info.get("flags", "").split() if f.startswith(VECTOR_FLAGS))
    return {
        "machine": platform.machine(),
        "vendor": info.get("vendor_id", ""),
        "model": info.get("model name", platform.processor()),
        "vector_flags": " ".join(vector),
        "torch_dispatch": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
    }
