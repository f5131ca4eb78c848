"""LoRA adapters: the adapted model starts as its base, trains only the adapters (and the
value head), computes as the base with its adapters off, and merges into a plain model that
gives its logits."""

import pytest
import torch

from rlhf.models import checkpoint
from rlhf.models.gpt import GPT, GPTConfig
from rlhf.models.hf import save_folder
from rlhf.models.llama import Llama, LlamaConfig
from rlhf.models.lora import (
    adapters,
    adapters_off,
    add_adapters,
    merged_model,
    merged_state_dict,
)

IDS = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(0))


def built(family: str):
    torch.manual_seed(0)
    if family == "gpt":
        return GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16))
    config = LlamaConfig(vocab_size=50, block_size=16, n_head=4, n_kv_head=2, mlp_width=32)
    return Llama(config)  # grouped-query attention: q, k, v of different widths


def trained_adapters(model):
    """`model` adapted, its adapters moved off zero as training moves them."""
    add_adapters(model, rank=4, alpha=8.0)
    with torch.no_grad():
        for layer in adapters(model):
            layer.lora_b.normal_(std=0.1)
    return model


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_an_adapted_model_starts_as_its_base_and_trains_only_its_adapters(family):
    base = built(family)
    before = base(IDS)
    n_linear = sum(
        isinstance(m, torch.nn.Linear) for b in base.transformer_blocks() for m in b.modules()
    )
    add_adapters(base, rank=4, alpha=8.0)
    assert len(adapters(base)) == n_linear  # attention and MLP, every block
    assert torch.equal(base(IDS), before)  # B = 0: no update yet
    trainable = {name for name, p in base.named_parameters() if p.requires_grad}
    adapter_params = {name for name, _ in base.named_parameters() if ".lora_" in name}
    assert len(adapter_params) == 2 * n_linear  # A and B of every adapter
    assert trainable == adapter_params | {"value_head.weight", "value_head.bias"}
    assert all(isinstance(m.base, torch.nn.Linear) for m in adapters(base))


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_adapters_off_is_the_base_model_and_merging_keeps_the_logits(family):
    base = built(family)
    plain = type(base)(base.config)
    plain.load_state_dict(base.state_dict())
    model = trained_adapters(base)
    adapted = model(IDS)
    assert (adapted - plain(IDS)).abs().max() > 1e-2  # the adapters do something
    with adapters_off(model):
        assert torch.equal(model(IDS), plain(IDS))  # the RL reference: the base, exactly
    assert all(layer.enabled for layer in adapters(model))
    torch.testing.assert_close(merged_model(model)(IDS), adapted, atol=1e-5, rtol=0)
    assert merged_state_dict(model).keys() == plain.state_dict().keys()


@torch.no_grad()
def test_an_adapted_policy_exports_merged_and_transformers_gives_its_logits(tmp_path):
    """What `rlhf export` does to a LoRA stage's policy: the checkpoint holds the merged
    weights, and the Hugging Face folder written from it gives the adapted model's logits."""
    transformers = pytest.importorskip("transformers")

    class Identity:
        identity = "t"

    model = trained_adapters(built("gpt")).eval()
    path = tmp_path / "policy.pt"
    checkpoint.save(path, checkpoint.model_payload(model, Identity(), "h", "policy"))
    loaded, _ = checkpoint.load_model(path)
    assert not adapters(loaded)
    torch.testing.assert_close(loaded(IDS), model(IDS), atol=1e-5, rtol=0)
    folder = save_folder(loaded, tmp_path / "hf")
    exported = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert (exported(input_ids=IDS).logits - model(IDS)).abs().max() <= 1e-5


def test_adapters_off_restores_what_it_found_and_adapting_twice_is_refused():
    model = trained_adapters(built("gpt"))
    with adapters_off(model):
        with adapters_off(model):
            pass
        assert not any(layer.enabled for layer in adapters(model))  # the outer block still off
    assert all(layer.enabled for layer in adapters(model))
    with pytest.raises(ValueError, match="adapters already"):
        add_adapters(model, rank=4, alpha=8.0)
    assert not any(t.requires_grad for t in merged_state_dict(model).values())
