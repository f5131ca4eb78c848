"""Building a backbone by name, and on `meta` (shapes only) for the memory estimate and the
weights check."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlhf.models.registry import build, build_on_meta

CONFIGS = {
    "gpt": {"vocab_size": 97, "block_size": 40, "n_layer": 2, "n_head": 4, "n_embd": 32},
    "llama": {
        "vocab_size": 97, "block_size": 40, "n_layer": 2, "n_head": 4, "n_kv_head": 2,
        "n_embd": 32, "mlp_width": 64, "rope_original_max_len": 16,  # Llama-3's scaled rotary
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_model_on_meta_has_every_tensor_of_the_model_built_here(name):
    built, meta = build(name, CONFIGS[name]), build_on_meta(name, CONFIGS[name])
    assert all(t.is_meta for t in meta.state_dict().values())
    assert {k: t.shape for k, t in meta.state_dict().items()} == {
        k: t.shape for k, t in built.state_dict().items()
    }
    assert {k: t.shape for k, t in meta.named_buffers()} == {
        k: t.shape for k, t in built.named_buffers()
    }


def test_building_on_meta_and_the_memory_estimate_do_not_load_torch_dynamo():
    """Random fills and arithmetic on `meta` run Python reference kernels, which import
    torch._dynamo, 2 s of CPU: what a stage refused for its model folder paid before its
    one-line error, and collect and evaluate (which build no optimizer, whose constructor
    loads it anyway) before their first step."""
    code = (
        "import sys; from rlhf.models.registry import build_on_meta; "
        "from rlhf.train.memory import Workload, estimate_bytes; "
        f"configs = {CONFIGS!r}; "
        "[build_on_meta(n, c) and estimate_bytes(n, c, Workload(sequences=2, sampled=2)) "
        "for n, c in configs.items()]; print('torch._dynamo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
