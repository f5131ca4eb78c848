"""The CPU a run's bytes depend on, and the kernels it may use there: outputs made on one CPU
reproduce byte for byte on a CPU with the same signature (docs/concepts.md, reproducibility
guarantees), and with the kernels pinned (`cpu_kernels`) on other CPUs too.

Three libraries pick float kernels by CPU, each summing in its own order: MKL (matrix
products) by vendor and instruction set, ATen (torch's own vectorized ops) and oneDNN (GELU,
convolutions) by instruction set, AVX-512 where there is one. Each reads an environment
variable at its first use, so a stage sets them (`pin_kernels`) before its first tensor
operation, as it fixes its thread count.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

# /proc/cpuinfo flags of the instructions float kernels are built from (x86-64 names)
VECTOR_FLAGS = ("avx", "amx", "fma", "f16c", "sse4")
X86_64 = ("x86_64", "AMD64")

# What each `cpu_kernels` choice sets (params.yaml). MKL's COMPATIBLE branch is the one it
# promises gives the same results on Intel and AMD processors; its AVX2 branch is honoured on
# Intel processors only (MKL runs AUTO elsewhere, other sums than Intel's AVX2 branch).
AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}  # torch's, oneDNN's
KERNEL_PINS: dict[str, dict[str, str]] = {
    "avx2": {"MKL_CBWR": "AVX2", **AVX2_CAPS},
    "portable": {"MKL_CBWR": "COMPATIBLE", **AVX2_CAPS},
    "native": {},
}
KERNEL_VARIABLES = ("MKL_CBWR", *AVX2_CAPS)


def pin_kernels(choice: str) -> None:
    """Set the kernel families `choice` allows (`KERNEL_PINS`; `native` clears them, leaving
    each library its own pick) for this process and those it starts. Must run before the
    process's first tensor operation: ATen, MKL and oneDNN read the variables once, at first
    use; ATen's pick is checked here. No effect off x86-64, where none of them applies."""
    if platform.machine() not in X86_64:
        return
    pins = KERNEL_PINS[choice]
    for name in KERNEL_VARIABLES:
        if name in pins:
            os.environ[name] = pins[name]
        else:
            os.environ.pop(name, None)
    import torch  # here, so that naming the CPU (rlhf.project) loads no torch

    dispatch = torch.backends.cpu.get_cpu_capability()
    if "ATEN_CPU_CAPABILITY" in pins and dispatch.startswith("AVX512"):
        raise RuntimeError(
            f"cpu_kernels: {choice} caps torch's kernels at AVX2, but torch had already picked "
            f"{dispatch} (a tensor operation ran before the stage pinned its kernels)"
        )


def cpu_signature(kernels: str) -> dict[str, str]:
    """What decides the last bits of a CPU run besides params, seed and threads: the processor
    (vendor and model, since MKL picks its kernels by vendor too), its vector instructions
    (AVX2 and AVX-512 kernels sum in different orders; two chips both named "AMD EPYC" can
    differ there), the kernels the run allowed itself (`cpu_kernels`), the machine and torch's
    version. Two runs with equal signatures write the same bytes."""
    import torch

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
        "kernels": kernels if platform.machine() in X86_64 else "native",
        "torch": torch.__version__,
    }
