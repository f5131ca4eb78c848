"""Packed forwards through varlen attention (CUDA, half precision) against the masked bins,
on the CPU: the varlen kernel replaced by causal SDPA run segment by segment, which is what
the kernel computes, so everything around it is checked here (the stream's runs, positions,
layouts, GQA, gradients); tests/gpu/test_cuda.py compares the real kernel."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from rlhf.models import attention, backbone
from rlhf.models.gpt import GPT, GPTConfig
from rlhf.models.llama import Llama, LlamaConfig
from rlhf.models.packing import pack, packed_hidden_states

MODELS = {
    "gpt": lambda: GPT(GPTConfig(vocab_size=97, block_size=40, n_layer=2, n_head=4, n_embd=32)),
    "llama-gqa": lambda: Llama(
        LlamaConfig(vocab_size=97, block_size=40, n_head=4, n_kv_head=2, qk_norm=True)
    ),
}
CAUSAL = ({"is_causal": True}, {"window_size": (-1, 0)})


def segment_by_segment(q, k, v, cu_q, cu_k, max_q, max_k, **causal):
    """What varlen attention computes over q, k, v [N, H, D]: each run causal on its own."""
    assert causal in CAUSAL and cu_q is cu_k and max_q == max_k
    assert q.dtype == k.dtype == v.dtype  # as the kernel requires
    bounds = cu_q.tolist()
    assert bounds[0] == 0 and bounds[-1] == q.shape[0]
    pieces = []
    for a, b in itertools.pairwise(bounds):
        assert 0 < b - a <= max_q
        run = (t[a:b].transpose(0, 1) for t in (q, k, v))  # [H, n, D]
        pieces.append(F.scaled_dot_product_attention(*run, is_causal=True).transpose(0, 1))
    return torch.cat(pieces)


REFERENCE = attention.Varlen(segment_by_segment, CAUSAL[0])


def rollout_like(lengths: list[tuple[int, int]], width: tuple[int, int]):
    prompt_width, response_width = width
    ids = torch.randint(3, 97, (len(lengths), prompt_width + response_width))
    real = torch.zeros_like(ids, dtype=torch.bool)
    for row, (p, r) in enumerate(lengths):
        real[row, prompt_width - p : prompt_width + r] = True
    return ids, real


def test_the_stream_is_cut_into_each_row_and_each_bins_trailing_padding():
    ids = torch.arange(40).view(4, 10)
    real = torch.zeros_like(ids, dtype=torch.bool)
    for row, n in enumerate((10, 3, 6, 4)):
        real[row, 10 - n :] = True
    packing = pack(ids, real, capacity=10, lengths=[10, 3, 6, 4])  # 10 | 6 + 4 | 3 + 7 padding
    runs = packing.runs
    assert runs.starts.dtype == torch.int32 and runs.longest == 10
    assert runs.starts.tolist() == [0, 10, 16, 20, 23, 30]
    flat = packing.segments.flatten()
    for a, b in itertools.pairwise(runs.starts.tolist()):
        assert (flat[a:b] == flat[a]).all()  # one row, or padding, per run


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_packed_forward_through_varlen_is_the_masked_bins_forward(name, monkeypatch):
    torch.manual_seed(0)
    model = MODELS[name]()
    ids, real = rollout_like([(3, 9), (8, 2), (5, 5), (1, 1), (8, 9), (6, 7)], (8, 9))
    outputs, grads = [], []
    for through_varlen in (False, True):
        if through_varlen:
            monkeypatch.setattr(backbone, "runs_varlen", lambda *args: True)
            monkeypatch.setattr(attention, "VARLEN", [REFERENCE])
        model.zero_grad()
        packing = pack(ids, real, capacity=24, lengths=real.sum(-1).tolist())  # 3 bins
        hidden = packed_hidden_states(model, ids, real, packing)
        torch.where(real, model.values(hidden), 0.0).square().sum().backward()
        outputs.append(hidden)
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=0)
    for masked, segmented in zip(*grads, strict=True):
        torch.testing.assert_close(segmented, masked, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("flash_gpu", [True, False])
def test_varlen_runs_on_a_flash_gpu_in_half_precision_without_dropout_only(flash_gpu, monkeypatch):
    """Only where flash attention runs (an Ampere or newer GPU, heads of at most 256
    dimensions): the varlen op, unlike SDPA, has no other kernel to fall back to."""
    monkeypatch.setattr(attention, "runs_flash", lambda index: flash_gpu)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert not attention.runs_varlen(cpu, torch.bfloat16, 0.0, 64)
    assert not attention.runs_varlen(cuda, torch.float32, 0.0, 64)  # no autocast here
    assert not attention.runs_varlen(cuda, torch.bfloat16, 0.1, 64)
    assert not attention.runs_varlen(cuda, torch.bfloat16, 0.0, 512)
    assert attention.runs_varlen(cuda, torch.bfloat16, 0.0, 64) == flash_gpu


def test_a_row_longer_than_the_capacity_is_one_run_its_bound_covers():
    ids = torch.arange(30).view(3, 10)
    real = torch.ones_like(ids, dtype=torch.bool)
    real[1, :6] = real[2, :3] = False
    packing = pack(ids, real, capacity=8, lengths=[10, 4, 7])  # 10 | 7 | 4: 3 bins of 10
    assert packing.runs.starts.tolist() == [0, 10, 17, 20, 24, 30]
    assert packing.runs.longest == 10


def test_causal_masking_is_asked_for_as_this_torch_spells_it():
    assert attention.varlen_available()  # torch >= 2.9, as the constraints pin it
    (varlen,) = attention.VARLEN
    assert varlen.causal in CAUSAL and varlen.kernel.__name__ == "varlen_attn"


def test_under_autocast_the_stream_reaches_the_kernel_in_one_half_dtype(monkeypatch):
    """Under bf16 autocast a rotary embedding leaves queries and keys in float32 beside bf16
    values, and autocast does not cast the varlen op's inputs as it casts SDPA's: all three
    reach the kernel in bf16 (the stand-in asserts one dtype), and the hidden states are the
    masked bins' within bf16 rounding."""
    torch.manual_seed(0)
    model = MODELS["llama-gqa"]()
    ids, real = rollout_like([(3, 9), (8, 2), (5, 5), (8, 9)], (8, 9))
    hidden = []
    for through_varlen in (False, True):
        monkeypatch.setattr(backbone, "runs_varlen", lambda *args, on=through_varlen: on)
        monkeypatch.setattr(attention, "VARLEN", [REFERENCE])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden.append(packed_hidden_states(model, ids, real).float())
    torch.testing.assert_close(hidden[1], hidden[0], atol=5e-2, rtol=5e-2)
