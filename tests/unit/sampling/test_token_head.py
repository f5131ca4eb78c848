"""The chunked token head (`rlhf.sampling.token_head`) against the plain computation from
the logits: log-probs, entropies and their gradients; compiled against eager; and RL's
forward routed through it where the blocks are compiled."""

import pytest
import torch
import torch.nn.functional as F

from rlhf.models.gpt import GPT, GPTConfig
from rlhf.sampling import token_head
from rlhf.sampling.forward import response_forward
from rlhf.sampling.token_head import TokenHead, chunk_grads, chunk_values, entropy

VOCAB, PADDED, WIDTH, TEMPERATURE = 97, 128, 24, 0.7


def inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 7, WIDTH, generator=generator, requires_grad=True)  # [B, N, C]
    weight = torch.randn(VOCAB, WIDTH, generator=generator) / 2
    weight = F.pad(weight, (0, 0, 0, PADDED - VOCAB)).requires_grad_()  # padded as on CUDA
    tokens = torch.randint(0, VOCAB, (3, 7), generator=generator)
    mix = torch.randn(2, 3, 7, generator=generator)  # how a loss weighs the two outputs
    return hidden, weight, tokens, mix


def plain(hidden, weight, tokens):
    logits = F.linear(hidden, weight)[..., :VOCAB].float() / TEMPERATURE
    logprobs = F.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    return logprobs, entropy(logits)


def gradients(outputs, mix, hidden, weight, with_entropy: bool = True):
    logprobs, entropies = outputs
    loss = (logprobs * mix[0]).sum() + ((entropies * mix[1]).sum() if with_entropy else 0)
    return torch.autograd.grad(loss, (hidden, weight))


@pytest.mark.parametrize("with_entropy", [True, False])
def test_the_chunked_head_gives_the_plain_values_and_gradients(with_entropy, monkeypatch):
    """Chunks of 5 of the 21 tokens (the last partial), the head padded from 97 to 128 rows:
    log-probs, entropies and the gradients for the hidden states and the head within float
    rounding (1e-6 relative) of the plain computation's; the padding's rows get a zero
    gradient. Without the entropy in the loss, its backward is skipped and the log-probs'
    gradients are the plain ones."""
    monkeypatch.setattr(token_head, "CHUNK_TOKENS", 5)
    hidden, weight, tokens, mix = inputs()
    expected = plain(hidden, weight, tokens)
    got = token_head.token_head(hidden, weight, tokens, TEMPERATURE, VOCAB, compiled=False)
    for value, want in zip(got, expected, strict=True):
        torch.testing.assert_close(value, want, atol=1e-6, rtol=1e-6)
    want_grads = gradients(expected, mix, hidden, weight, with_entropy)
    got_grads = gradients(got, mix, hidden, weight, with_entropy)
    for grad, want in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(grad, want, atol=1e-6, rtol=1e-6)
    assert (got_grads[1][VOCAB:] == 0).all()


@pytest.mark.slow
def test_the_compiled_chunks_compute_the_eager_chunks():
    """Both chunk functions compiled whole (inductor, fullgraph, on the CPU) over two chunk
    sizes: the eager values and gradients within float rounding (1e-6 relative)."""
    values, grads = token_head.compiled_chunks()
    for rows in (8, 5):
        hidden, weight, tokens, _ = inputs(rows)
        hidden, weight = hidden.detach().flatten(0, 1)[:rows], weight.detach()
        tokens, grad_out = tokens.flatten()[:rows], torch.randn(2, rows)
        eager = chunk_values(hidden, weight, tokens, TEMPERATURE, VOCAB)
        compiled = values(hidden, weight, tokens, TEMPERATURE, VOCAB)
        for got, want in zip(compiled[:2], eager[:2], strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        args = (hidden, weight, tokens, TEMPERATURE, VOCAB, torch.float32, *grad_out, True, True)
        for got, want in zip(grads(*args), chunk_grads(*args), strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_rls_forward_reads_the_head_in_chunks_where_the_blocks_are_compiled(monkeypatch):
    """A model whose blocks are compiled (here: stand-ins, the blocks themselves) and the
    chunks' compiled pair (here: the eager one) give the plain forward's log-probs and
    entropies, through `TokenHead`."""
    torch.manual_seed(0)
    net = GPT(GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=2, n_head=2, n_embd=16))
    ids = torch.randint(3, VOCAB, (4, 20))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :5] = mask[3, 16:] = False
    expected = response_forward(net, ids, mask, 8, TEMPERATURE, entropy_grad=True)
    monkeypatch.setattr(token_head, "compiled_chunks", lambda: (chunk_values, chunk_grads))
    applied = []
    monkeypatch.setattr(TokenHead, "apply", lambda *args: applied.append(1) or apply(*args))
    apply = torch.autograd.Function.apply.__get__(TokenHead)
    net.compiled_blocks = {id(b): b for b in net.transformer_blocks()}
    got = response_forward(net, ids, mask, 8, TEMPERATURE, entropy_grad=True)
    assert applied and got.entropy is not None and got.entropy.requires_grad
    torch.testing.assert_close(got.logprobs, expected.logprobs, atol=1e-6, rtol=0)
    torch.testing.assert_close(got.entropy, expected.entropy, atol=1e-6, rtol=0)
    logged = response_forward(net, ids, mask, 8, TEMPERATURE, entropy_grad=False)
    assert logged.entropy is not None and not logged.entropy.requires_grad
