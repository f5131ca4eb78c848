"""The LM head padded to a multiple of 64 tokens (what CUDA gets, forced on here on the CPU)
computes what the unpadded head does: the same logits, SFT loss and gradients, RL log-probs
and sampled tokens, while the parameters, their gradients and the checkpoint keep the real
vocabulary. Off CUDA nothing is padded, so CPU outputs stay byte-identical."""

import pytest
import torch

from rlhf.algorithms.sft import masked_lm_loss
from rlhf.data.batching import IGNORE_INDEX
from rlhf.models import backbone
from rlhf.models.backbone import VOCAB_MULTIPLE
from rlhf.models.gpt import GPT, GPTConfig
from rlhf.models.llama import Llama, LlamaConfig
from rlhf.sampling.forward import response_forward
from rlhf.sampling.generate import generate
from rlhf.sampling.sampler import SamplingConfig

VOCAB = 97  # padded to 128


def model(family: str):
    torch.manual_seed(0)
    if family == "gpt":  # the head tied to the embedding
        return GPT(GPTConfig(vocab_size=VOCAB, block_size=48, n_layer=2, n_head=2, n_embd=32))
    return Llama(LlamaConfig(vocab_size=VOCAB, n_kv_head=2, head_dim=16, qk_norm=True))


def padded(net):
    net.vocab_multiple = VOCAB_MULTIPLE
    return net


def batch():
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, VOCAB, (3, 20), generator=generator)
    targets = torch.randint(0, VOCAB, (3, 20), generator=generator)
    targets[:, :7] = IGNORE_INDEX
    return inputs, targets


def loss_and_gradients(net):
    loss = masked_lm_loss(net, *batch())
    loss.backward()
    grads = {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}
    net.zero_grad()
    return loss.detach(), grads


@pytest.fixture
def pad_small_matmuls(monkeypatch):
    """These tests' matmuls have a few dozen rows: pad them too (the rule is tested apart)."""
    monkeypatch.setattr(backbone, "PADDED_ROWS", 1)


def test_the_head_pads_only_where_asked_or_on_cuda():
    """Off CUDA, nothing unless asked (the CPU's numbers stay as they were); asked, a matmul
    of PADDED_ROWS rows or more, never a decoding step's few."""
    net = model("gpt")
    weight, vocab = net.head_weight(backbone.PADDED_ROWS)
    assert weight is net.lm_head.weight and vocab == VOCAB
    assert padded(net).head_weight(backbone.PADDED_ROWS - 1)[0] is net.lm_head.weight
    weight, vocab = net.head_weight(backbone.PADDED_ROWS)
    assert weight.shape == (128, 32) and vocab == VOCAB
    assert torch.equal(weight[:VOCAB], net.lm_head.weight) and not weight[VOCAB:].any()


@pytest.mark.usefixtures("pad_small_matmuls")
@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_padded_logits_loss_and_gradients_are_the_unpadded_ones(family):
    """Forward logits [B, T, 97], the chunked SFT loss and every parameter's gradient, each
    within float32 rounding of the unpadded head's; the gradients have the parameters'
    shapes (the padding's share of the head's gradient is dropped, and was zero)."""
    plain, wide = model(family), padded(model(family))
    inputs, _ = batch()
    expected = plain(inputs)
    logits = wide(inputs)
    assert logits.shape == expected.shape == (3, 20, VOCAB)
    torch.testing.assert_close(logits, expected, atol=1e-6, rtol=0)
    (loss, grads), (expected_loss, expected_grads) = (loss_and_gradients(n) for n in (wide, plain))
    torch.testing.assert_close(loss, expected_loss, atol=1e-6, rtol=0)
    assert grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        assert grads[name].shape == grad.shape
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=0)
    assert wide.state_dict().keys() == plain.state_dict().keys()
    for name, tensor in plain.state_dict().items():
        assert wide.state_dict()[name].shape == tensor.shape


@pytest.mark.usefixtures("pad_small_matmuls")
def test_padded_sampling_draws_the_same_tokens_with_the_same_logprobs():
    """Generation and the RL stage's response forward: the same tokens from the same seed
    (no padded id is ever drawn) and log-probs within rounding."""
    plain, wide = model("gpt").eval(), padded(model("gpt").eval())
    config = SamplingConfig(max_new_tokens=12, temperature=0.9, top_p=0.95)
    outs = [
        generate(
            net, [[5, 6, 7], [8, 9, 10, 11], [12]], eos_id=1, pad_id=2, config=config,
            generator=torch.Generator().manual_seed(3),
        )
        for net in (plain, wide)
    ]  # fmt: skip
    assert torch.equal(outs[0].tokens, outs[1].tokens) and torch.equal(outs[0].mask, outs[1].mask)
    assert int(outs[1].tokens.max()) < VOCAB
    torch.testing.assert_close(outs[1].logprobs, outs[0].logprobs, atol=1e-5, rtol=0)
    out = outs[0]
    ids, mask = torch.cat([out.prompt, out.tokens], 1), torch.cat([out.prompt_mask, out.mask], 1)
    with torch.no_grad():
        forwards = [
            response_forward(n, ids, mask, out.prompt.shape[1], entropy_grad=False)
            for n in (plain, wide)
        ]
    torch.testing.assert_close(forwards[1].logprobs, forwards[0].logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(forwards[1].entropy, forwards[0].entropy, atol=1e-5, rtol=0)
