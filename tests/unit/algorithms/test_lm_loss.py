"""The chunked LM loss is the plain one, and a compiled training step is the eager one."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from rlhf.algorithms import lm_loss
from rlhf.algorithms.sft import masked_lm_loss
from rlhf.data.batching import IGNORE_INDEX
from rlhf.models import backbone
from rlhf.models.backbone import VOCAB_MULTIPLE
from rlhf.models.gpt import GPT, GPTConfig
from rlhf.models.llama import Llama, LlamaConfig
from rlhf.train.optim import adamw

VOCAB = 97


def model(family: str, bias: bool = True):
    torch.manual_seed(0)
    if family == "gpt":  # the head tied to the embedding: both gradients meet in one weight
        config = GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=2, n_head=2, n_embd=32)
        return GPT(dataclasses.replace(config, bias=bias))
    return Llama(LlamaConfig(vocab_size=VOCAB, n_kv_head=2, head_dim=16, qk_norm=True))


def batch():
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, VOCAB, (3, 20), generator=generator)
    targets = torch.randint(0, VOCAB, (3, 20), generator=generator)
    targets[:, :7] = IGNORE_INDEX  # the prompts
    targets[1, 15:] = IGNORE_INDEX  # a shorter answer
    return inputs, targets


def plain_loss(net, inputs, targets):
    logits = net(inputs).flatten(0, 1).float()  # [B * T, V]
    return F.cross_entropy(logits, targets.flatten(), ignore_index=IGNORE_INDEX)


def gradients(net) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}
    net.zero_grad()
    return grads


def both_losses(net, inputs, targets):
    """The plain and the chunked loss of one batch, each with every parameter's gradient."""
    results = []
    for loss_of in (plain_loss, masked_lm_loss):
        loss = loss_of(net, inputs, targets)
        loss.backward()
        results.append((loss.detach(), gradients(net)))
    return results


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_one_chunk_is_the_plain_loss_bit_for_bit(family):
    """A batch within one chunk (every batch of the default config): the same loss and the
    same gradients, bit for bit, so the default pipeline's numbers do not move."""
    (expected, plain), (chunked, grads) = both_losses(model(family), *batch())
    assert torch.equal(chunked, expected) and grads.keys() == plain.keys()
    assert all(torch.equal(grad, plain[name]) for name, grad in grads.items())


def test_the_graph_keeps_no_gradient_after_the_backward():
    """The gradients made in the forward are handed to autograd, not kept by the loss's graph
    node: a [V, C] float32 head gradient would otherwise outlive the backward beside the
    parameter's own, as long as the loss (through the optimizer step)."""
    net, (inputs, targets) = model("gpt"), batch()
    loss = masked_lm_loss(net, inputs, targets)
    head, hidden = loss.grad_fn.grads[1], loss.grad_fn.grads[0]
    assert head.shape == net.lm_head.weight.shape and hidden.shape[-1] == head.shape[1]
    loss.backward()
    assert loss.grad_fn.grads is None


def test_the_backward_scales_the_gradients_by_the_upstream_gradient():
    """The gradients the forward made are multiplied by the loss's own gradient: a weighted
    term (PPO-ptx's `ptx_coef`, a microbatch's share of its minibatch) gets its weight's
    share of every gradient, 3 times the loss 3 times each parameter's gradient."""
    net, (inputs, targets) = model("gpt"), batch()
    masked_lm_loss(net, inputs, targets).backward()
    once = gradients(net)
    (3 * masked_lm_loss(net, inputs, targets)).backward()
    thrice = gradients(net)
    assert thrice.keys() == once.keys()
    for name, grad in once.items():
        torch.testing.assert_close(thrice[name], 3 * grad)


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_the_chunked_loss_is_the_plain_loss_with_its_gradients(family, monkeypatch):
    """Chunks of 16 of the 60 tokens (four, the last partial): the loss and every parameter's
    gradient within 1e-6 of the plain computation's; without gradients, the same loss."""
    monkeypatch.setattr(lm_loss, "CHUNK_TOKENS", 16)
    net, (inputs, targets) = model(family), batch()
    (expected, plain), (chunked, grads) = both_losses(net, inputs, targets)
    torch.testing.assert_close(chunked, expected, atol=1e-6, rtol=0)
    assert grads.keys() == plain.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=0)
    with torch.no_grad():
        unrecorded = masked_lm_loss(net, inputs, targets)
    torch.testing.assert_close(unrecorded, expected, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_a_compiled_sft_step_is_the_eager_step(monkeypatch):
    """Blocks and the loss's chunks compiled (inductor, on the CPU), with the LM head
    padded to 128 tokens as on CUDA: three AdamW steps of the SFT loss give the unpadded
    eager steps' losses and leave every weight within 1e-5 of theirs.
    Without biases: the key projection's bias has a gradient of exactly zero in exact
    arithmetic (attention ignores a shift of every key score), so its float gradient is
    rounding noise, which Adam's normalization turns into steps of up to lr either way."""
    monkeypatch.setattr(lm_loss, "CHUNK_TOKENS", 32)
    monkeypatch.setattr(backbone, "PADDED_ROWS", 1)  # this batch's 60 rows padded too
    inputs, targets = batch()
    losses, trained = [], []
    for compiled in (False, True):
        net = model("gpt", bias=False)
        if compiled:
            net.compile_blocks()
            net.vocab_multiple = VOCAB_MULTIPLE
        optimizer = adamw(net, 1e-2, 0.1, (0.9, 0.95))
        for _ in range(3):
            optimizer.zero_grad()
            loss = masked_lm_loss(net, inputs, targets)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        trained.append(net.state_dict())
    torch.testing.assert_close(losses[3:], losses[:3], atol=1e-5, rtol=0)
    for name, weight in trained[0].items():
        torch.testing.assert_close(trained[1][name], weight, atol=1e-5, rtol=0)


@pytest.mark.parametrize("vocab", [61, 56])
@pytest.mark.parametrize(
    ("for_hidden", "for_weight"), [(True, True), (True, False), (False, False)]
)
def test_a_chunk_compiles_whole_to_what_it_computes_eagerly(for_hidden, for_weight, vocab):
    """fullgraph: the chunk's gradients are explicit kernels, not `autograd.grad` (which
    broke the compiled graph twice per chunk); captured by dynamo, the same numbers, with
    the head's rows all real (61) or the last 5 padding (56 real, as on CUDA)."""
    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(0)
    hidden, weight = (
        torch.randn(40, 16, generator=generator),
        torch.randn(61, 16, generator=generator),
    )
    targets = torch.randint(0, 61, (40,), generator=generator)
    targets[::4] = IGNORE_INDEX
    scale = torch.tensor(1 / 30)
    captured = torch.compile(lm_loss.chunk_terms, fullgraph=True, backend="eager")
    targets = targets % vocab
    targets[::4] = IGNORE_INDEX
    eager = lm_loss.chunk_terms(hidden, weight, targets, scale, for_hidden, for_weight, vocab)
    compiled = captured(hidden, weight, targets, scale, for_hidden, for_weight, vocab)
    for a, b in zip(eager, compiled, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
