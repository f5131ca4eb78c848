"""The bf16 sampling copy computes what the float32 model computes under bf16 autocast (run
here with the CPU's autocast: on CUDA the RL stage samples through it), keeps the embeddings
and norms in float32, and follows the trained model's updates in place."""

import pytest
import torch

from rlhf.models.precision import SamplingCopy, wants_sampling_copy
from rlhf.train.optim import adamw

from decoding_cases import MODELS, SAMPLINGS, decode


def bf16_autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_copy_gives_autocasts_logits_and_tokens(name, monkeypatch):
    """Bit for bit: autocast casts each float32 weight to the very bfloat16 the copy holds."""
    model = MODELS[name]()
    sampler = SamplingCopy(model).refresh()
    ids = torch.randint(3, 60, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), bf16_autocast():
        assert torch.equal(sampler(ids), model(ids))
        for config in SAMPLINGS.values():
            mine, theirs = (decode(m, "eager", config, monkeypatch) for m in (sampler, model))
            assert torch.equal(mine.tokens, theirs.tokens)
            assert torch.equal(mine.logprobs, theirs.logprobs)


def test_matmul_weights_are_bf16_and_the_rest_float32_the_model_untouched():
    model = MODELS["gpt+lora"]()
    sampler = SamplingCopy(model).refresh()
    kinds = {name: p.dtype for name, p in sampler.named_parameters()}
    assert kinds["wte.weight"] == kinds["wpe.weight"] == torch.float32  # the residual stream
    assert kinds["lm_head.weight"] == torch.bfloat16  # untied from wte for the copy
    assert kinds["ln_f.weight"] == kinds["ln_f.bias"] == torch.float32
    matmuls = [n for n in kinds if n.endswith(("lora_a", "lora_b", "base.weight"))]
    assert matmuls and all(kinds[n] == torch.bfloat16 for n in matmuls)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.lm_head.weight is model.wte.weight
    assert not any(p.requires_grad for p in sampler.parameters())


def test_a_refresh_follows_an_update_in_place():
    """After an optimizer step on the model, the refreshed copy gives the updated model's
    logits under autocast, from the same tensors (a captured decoding graph reads them)."""
    model = MODELS["gpt"]()
    copy = SamplingCopy(model)
    before = {name: p.data_ptr() for name, p in copy.model.named_parameters()}
    optimizer = adamw(model.train(), 1e-2, 0.0, (0.9, 0.95))
    ids = torch.randint(3, 60, (2, 10), generator=torch.Generator().manual_seed(1))
    model(ids).logsumexp(-1).mean().backward()
    optimizer.step()
    model.eval()
    sampler = copy.refresh()
    assert {name: p.data_ptr() for name, p in sampler.named_parameters()} == before
    with torch.no_grad(), bf16_autocast():
        assert torch.equal(sampler(ids), model(ids))


def test_only_a_float32_model_sampled_under_cuda_autocast_gets_a_copy():
    model = MODELS["gpt"]()
    assert wants_sampling_copy(model, torch.device("cuda"), bf16=True)
    assert not wants_sampling_copy(model, torch.device("cpu"), bf16=True)
    assert not wants_sampling_copy(model, torch.device("cuda"), bf16=False)
    assert not wants_sampling_copy(model.to(torch.bfloat16), torch.device("cuda"), bf16=True)
