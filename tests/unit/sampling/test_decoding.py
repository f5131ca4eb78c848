"""The static decoding step: compiled whole, never recompiled as positions move, and the same
tokens and log-probs as the eager steps from the same row streams."""

import pytest
import torch
from torch._dynamo.utils import counters

from rlhf.sampling import generate as decoding
from rlhf.sampling.sampler import SamplingConfig, choose_from_probs, draws_per_step
from rlhf.sampling.streams import RowStreams

from decoding_cases import EOS, MODELS, PAD, PROMPTS, SAMPLINGS, adapted, decode, gpt


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Each test compiles from nothing (and leaves nothing compiled to the next)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", MODELS)
def test_the_decode_step_compiles_whole_once_for_a_whole_generation(name, monkeypatch):
    """fullgraph: any graph break fails. A 128-step generation (rows that never end)
    compiles the decoding step once (the first token's choice runs eagerly); another batch of
    other prompt lengths (so other positions at every step, within the same cache bucket)
    compiles nothing more."""
    monkeypatch.setattr(decoding, "COMPILE_BACKEND", "eager")  # capture alone: no codegen
    model = MODELS[name]()
    counters.clear()
    config = SAMPLINGS["whole distribution"]
    out = decode(model, "compiled", config, monkeypatch, eos=-1)  # no row ends
    assert out.mask.all()  # 128 steps, at moving positions
    assert counters["stats"]["unique_graphs"] == 1
    with torch._dynamo.config.patch(error_on_recompile=True):
        other_lengths = [[*p[::-1], 30] for p in PROMPTS[::-1]]
        decode(model, "compiled", config, monkeypatch, prompts=other_lengths, eos=-1)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("pad", [PAD, EOS], ids=["pad!=end", "pad=end"])
def test_static_steps_sample_what_eager_steps_sample(name, sampling, pad, monkeypatch):
    """The static path (preallocated cache read whole, every nucleus draw at once) captured
    by dynamo against the eager steps, from the same streams: the same tokens, rows ending
    at different steps, and log-probs within float rounding (the static cache's attention
    sums over the whole buffer; on an Intel Xeon, whose AVX-512 kernels sum in other orders, a
    log-prob of -1.45 came 10 units in the last place apart): float32's relative tolerance."""
    monkeypatch.setattr(decoding, "COMPILE_BACKEND", "eager")
    model, config = MODELS[name](), SAMPLINGS[sampling]
    eager = decode(model, "eager", config, monkeypatch, pad)
    static = decode(model, "compiled", config, monkeypatch, pad)
    assert torch.equal(static.tokens, eager.tokens) and torch.equal(static.mask, eager.mask)
    torch.testing.assert_close(static.logprobs, eager.logprobs, atol=1e-6, rtol=1.3e-6)
    if name == "gpt":
        assert len(set(eager.mask.sum(-1).tolist())) > 1  # rows ended apart


@pytest.mark.slow
def test_the_inductor_compiled_step_samples_what_eager_steps_sample(monkeypatch):
    """Compiled to kernels (what a GPU runs, here on the CPU), top-p included: the same
    tokens, log-probs within 1e-6."""
    model = adapted(gpt())
    config = SamplingConfig(max_new_tokens=48, top_p=0.8, temperature=1.2)
    eager = decode(model, "eager", config, monkeypatch)
    compiled = decode(model, "compiled", config, monkeypatch)
    assert torch.equal(compiled.tokens, eager.tokens)
    torch.testing.assert_close(compiled.logprobs, eager.logprobs, atol=1e-6, rtol=0)


NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=NEEDS_CUDA)])
def test_the_compiled_choice_at_gpt2s_vocabulary_is_the_eager_choice(device):
    """Inductor kernels for the choice of a token, at GPT-2's 50257 tokens (where CUDA's
    inductor would split the running sums into a kernel torch 2.11 fails to generate), from
    the same probabilities and uniforms: exactly the eager tokens, for every sampling rule."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 50257, generator=generator) * 3  # [B, V]
    probs = logits.softmax(-1).to(device)
    uniforms = torch.rand(16, 9, generator=generator).to(device)  # the most a step draws
    for config in SAMPLINGS.values():
        u = uniforms[:, : draws_per_step(config, 50257)]  # [B, R]
        choose = torch.compile(choose_from_probs, fullgraph=True, dynamic=False)
        compiled = choose(probs, config, u, static=True)
        assert torch.equal(compiled, choose_from_probs(probs, config, u, static=True))
        assert torch.equal(compiled, choose_from_probs(probs, config, u))


def test_a_shapes_kept_buffers_decode_what_fresh_ones_decode(monkeypatch):
    """Two calls of one shape share the buffers kept with the model (the second copies its
    prompts and uniforms in over the first's), and give exactly what each gives on buffers
    of its own."""
    monkeypatch.setattr(decoding, "COMPILE_BACKEND", "eager")
    model, config = adapted(gpt()), SAMPLINGS["top-p"]
    other = [[*p[::-1], 30] for p in PROMPTS[::-1]]  # other lengths, the same cache bucket
    kept = [decode(model, "compiled", config, monkeypatch, prompts=p) for p in (PROMPTS, other)]
    assert len(decoding._decoders[model].by_shape) == 1
    fresh = []
    for prompts in (PROMPTS, other):
        decoding._decoders.pop(model)
        fresh.append(decode(model, "compiled", config, monkeypatch, prompts=prompts))
    for a, b in zip(kept, fresh, strict=True):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask)
        assert torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(kept[0].tokens, kept[1].tokens)
    assert kept[0].tokens.data_ptr() != kept[1].tokens.data_ptr()  # results are the caller's


def test_kept_buffers_survive_in_place_updates_and_go_when_parameters_move(monkeypatch):
    monkeypatch.setattr(decoding, "COMPILE_BACKEND", "eager")
    model, config = adapted(gpt()), SAMPLINGS["whole distribution"]
    decode(model, "compiled", config, monkeypatch)
    kept = decoding._decoders[model]
    with torch.no_grad():
        next(model.parameters()).add_(0.01)  # what an optimizer step does
    decode(model, "compiled", config, monkeypatch)
    assert decoding._decoders[model] is kept
    model.to(torch.float64).to(torch.float32)  # new storage for every parameter
    decode(model, "compiled", config, monkeypatch)
    assert decoding._decoders[model] is not kept


def test_a_smaller_last_batch_padded_to_the_batch_size_compiles_nothing_more(monkeypatch):
    """A collect-shaped run: batches of 4, 4 and 2 prompts of uneven lengths, the last
    padded to 4 rows (`batch_to`): one compile for all three, and the padded batch's answers
    are exactly those of the 2 prompts decoded alone."""
    monkeypatch.setattr(decoding, "COMPILE_BACKEND", "eager")
    model, config = adapted(gpt()), SAMPLINGS["top-k"]
    prompts = [[*p, *p[:i]] for i, p in enumerate(PROMPTS * 3)][:10]
    monkeypatch.setenv("RLHF_DECODE", "compiled")
    counters.clear()

    def run(rows: list[list[int]], batch_to: int) -> decoding.Generation:
        streams = RowStreams(list(range(len(rows))))
        return decoding.generate(
            model, rows, eos_id=EOS, pad_id=PAD, config=config, generator=streams, batch_to=batch_to
        )

    run(prompts[:4], 4)
    with torch._dynamo.config.patch(error_on_recompile=True):
        run(prompts[4:8], 4)
        last = run(prompts[8:], 4)
    assert counters["stats"]["unique_graphs"] == 1
    alone = run(prompts[8:], 0)
    assert last.tokens.shape[0] == 2
    assert torch.equal(last.tokens, alone.tokens) and torch.equal(last.logprobs, alone.logprobs)


@pytest.mark.parametrize(("every", "expected"), [(1, 3), (8, 8)])
def test_the_steps_stop_at_the_first_check_after_every_row_ended(every, expected):
    """Every row ends at step 3: checked every step, 3 steps run; checked every 8 (a GPU's
    graph), 8 run; never more than that."""
    finished, calls = torch.zeros(2, dtype=torch.bool), []

    def step() -> None:
        calls.append(1)
        finished.fill_(len(calls) >= 3)

    decoding.run_steps(step, 20, finished, every)
    assert len(calls) == expected
