"""`cpu_kernels`: the kernel families a stage pins before its first tensor operation, and what
the CPU signature records of them."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from rlhf.cpu import KERNEL_PINS, KERNEL_VARIABLES, cpu_signature, pin_kernels
from rlhf.dvcfile import STAGE_MODULES

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 kernels")

# In a fresh interpreter: import every stage module as `python -m` would, then pin a probe
# setting each library shows when it took effect: ATen's DEFAULT dispatch, and MKL's
# COMPATIBLE branch (3 in mkl_cbwr.h) read back from the MKL inside torch.
PROBE = textwrap.dedent(
    """
    import ctypes, importlib, os, sys
    import torch
    for module in sys.argv[1:]:
        importlib.import_module(module)
    os.environ.update(MKL_CBWR="COMPATIBLE", ATEN_CPU_CAPABILITY="default")
    a = torch.randn(64, 64)
    a @ a
    mkl = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    print(torch.backends.cpu.get_cpu_capability(), mkl.mkl_serv_cbwr_get(1))
    """
)


def test_importing_a_stage_runs_no_tensor_operation_before_its_kernels_are_pinned():
    """The variables take effect only before each library's first use: a stage module's
    imports must leave ATen and MKL unstarted, or the pin in `StageRun.start` comes too late
    (ATen's is also checked there; MKL's could not be)."""
    clean = {k: v for k, v in os.environ.items() if k not in KERNEL_VARIABLES}
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, *STAGE_MODULES], env=clean, capture_output=True, text=True
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["DEFAULT", "3"]


def test_pinning_sets_each_choice_and_native_clears_them(monkeypatch):
    for name in KERNEL_VARIABLES:
        monkeypatch.setenv(name, "set by hand")
    pin_kernels("native")
    assert not any(name in os.environ for name in KERNEL_VARIABLES)
    pin_kernels("portable")
    assert {name: os.environ[name] for name in KERNEL_VARIABLES} == KERNEL_PINS["portable"]
    assert os.environ["MKL_CBWR"] == "COMPATIBLE"  # MKL's branch that is the same on AMD


def test_the_signature_records_the_kernels():
    assert cpu_signature("portable")["kernels"] == "portable"
    assert cpu_signature("native") == cpu_signature("portable") | {"kernels": "native"}
