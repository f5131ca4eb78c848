import pytest
import torch

from rlhf.data.batching import left_pad
from rlhf.models.gpt import GPT, GPTConfig
from rlhf.sampling import sampler
from rlhf.sampling.forward import response_forward
from rlhf.sampling.generate import generate
from rlhf.sampling.sampler import (
    SamplingConfig,
    choose_from_probs,
    draws_per_step,
    mass_ahead,
    nucleus,
    sample_from,
)
from rlhf.sampling.streams import RowStreams

EOS, PAD = 1, 2


@pytest.fixture
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=60, block_size=48, n_layer=2, n_head=2, n_embd=32)).eval()


PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14]]


def run(model, config, seed=0, pad=PAD):
    return generate(
        model,
        PROMPTS,
        eos_id=EOS,
        pad_id=pad,
        config=config,
        generator=torch.Generator().manual_seed(seed),
    )


def favour_the_end_token(model) -> None:
    """A constant feature that favours the end token: rows stop early, at different steps."""
    with torch.no_grad():
        model.ln_f.bias[0] = 1.0
        model.lm_head.weight[EOS, 0] = 3.0


def test_sampling_logprobs_match_a_full_forward_pass(model):
    out = run(model, SamplingConfig(max_new_tokens=16, temperature=0.7, top_p=0.9, top_k=20))
    ids = torch.cat([out.prompt, out.tokens], dim=1)
    mask = torch.cat([out.prompt_mask, out.mask], dim=1)
    with torch.no_grad():
        recomputed = response_forward(model, ids, mask, out.prompt.shape[1], temperature=0.7)
    assert recomputed.logprobs.shape == out.logprobs.shape
    assert recomputed.hidden.shape[:2] == out.tokens.shape and recomputed.entropy is None
    torch.testing.assert_close(
        recomputed.logprobs[out.mask], out.logprobs[out.mask], atol=1e-4, rtol=0
    )


def test_the_head_runs_on_one_position_a_row_the_prefill_included(model, monkeypatch):
    """No [B, T, V] logits of the prompt (at 64 x 512 tokens of Qwen3's vocabulary, 10 GB in
    bfloat16): the prefill keeps the last position's (the log-probs still match a full
    forward's, above)."""
    monkeypatch.setenv("RLHF_DECODE", "eager")  # every head call runs, none only traced
    head_inputs = []
    lm_logits = model.lm_logits

    def recorded(hidden: torch.Tensor) -> torch.Tensor:
        head_inputs.append(hidden.shape)
        return lm_logits(hidden)

    monkeypatch.setattr(model, "lm_logits", recorded)
    run(model, SamplingConfig(max_new_tokens=5))
    assert head_inputs == [(len(PROMPTS), 1, 32)] * 5  # the prefill, then four steps


def test_rows_stop_at_the_end_token_and_pad_after(model):
    favour_the_end_token(model)
    out = run(model, SamplingConfig(max_new_tokens=30))
    lengths = out.mask.sum(-1)
    for row, length in zip(out.tokens.tolist(), lengths.tolist(), strict=True):
        if EOS in row:
            end = row.index(EOS)
            assert length == end + 1
            assert all(t == PAD for t in row[end + 1 :])
        assert PAD not in row[:length]
    assert out.ended.all() and len(set(lengths.tolist())) > 1


def test_pad_is_never_sampled_even_when_likely(model):
    with torch.no_grad():
        model.lm_head.weight[PAD] += 5.0
    out = run(model, SamplingConfig(max_new_tokens=10))
    assert not (out.tokens[out.mask] == PAD).any()


def test_rows_end_where_padding_is_the_end_token(model):
    """GPT-2's tokenizer has no pad token and pads with its end token, which must stay
    sampleable there: otherwise no answer could ever end."""
    favour_the_end_token(model)
    out = run(model, SamplingConfig(max_new_tokens=30), pad=EOS)
    lengths = out.mask.sum(-1)
    assert out.ended.all() and (lengths < 30).all()
    for row, length in zip(out.tokens.tolist(), lengths.tolist(), strict=True):
        assert EOS not in row[: length - 1] and set(row[length - 1 :]) == {EOS}


def test_greedy_is_deterministic_and_seeds_control_sampling(model):
    greedy = SamplingConfig(max_new_tokens=8, greedy=True)
    assert torch.equal(run(model, greedy, 1).tokens, run(model, greedy, 2).tokens)
    sample = SamplingConfig(max_new_tokens=8)
    assert torch.equal(run(model, sample, 3).tokens, run(model, sample, 3).tokens)
    assert not torch.equal(run(model, sample, 3).tokens, run(model, sample, 4).tokens)


def test_batched_greedy_equals_each_prompt_alone(model):
    config = SamplingConfig(max_new_tokens=8, greedy=True)
    batched = run(model, config).tokens
    for i, prompt in enumerate(PROMPTS):
        alone = generate(model, [prompt], eos_id=EOS, pad_id=PAD, config=config).tokens[0]
        assert torch.equal(batched[i], alone)


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(max_new_tokens=12),
        SamplingConfig(max_new_tokens=12, temperature=1.5, top_p=0.5),  # many redraws
        SamplingConfig(max_new_tokens=12, top_k=5, top_p=0.8),
    ],
)
def test_a_stream_per_row_samples_each_row_alike_in_any_batch(model, config):
    """What data-parallel ranks rely on: a row's answer depends on its seed alone, not on the
    rows beside it; one shared generator would hand the same row other draws."""
    seeds = [11, 12, 13]
    together = generate(
        model, PROMPTS, eos_id=EOS, pad_id=PAD, config=config, generator=RowStreams(seeds)
    )
    for rows in ([2, 0], [1]):
        apart = generate(model, [PROMPTS[i] for i in rows], eos_id=EOS, pad_id=PAD,
                         config=config, generator=RowStreams([seeds[i] for i in rows]))  # fmt: skip
        assert torch.equal(apart.tokens, together.tokens[rows])
    shared = generate(model, [PROMPTS[1]], eos_id=EOS, pad_id=PAD, config=config,
                      generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert not torch.equal(shared.tokens[0], together.tokens[1])  # the seed is what decides
    reseeded = generate(
        model, PROMPTS, eos_id=EOS, pad_id=PAD, config=config, generator=RowStreams([11, 99, 13])
    )
    assert torch.equal(reseeded.tokens[[0, 2]], together.tokens[[0, 2]])
    assert not torch.equal(reseeded.tokens[1], together.tokens[1])


def kept_by_sort(probs, top_p):
    """The nucleus the textbook way: sort, then keep tokens until top_p is reached."""
    sorted_probs, order = torch.sort(probs, descending=True)
    return sorted(order[nucleus(sorted_probs, top_p) > 0].tolist())


def kept(probs, top_p):
    tokens = torch.arange(probs.shape[-1])
    inside = mass_ahead(probs, tokens[None]) < top_p * probs.sum(-1, keepdim=True)
    return sorted(tokens[inside[0]].tolist())


def drawn(probs, config, draws=20_000, static=False):
    """Share of `draws` samples on each token."""
    generator = torch.Generator().manual_seed(0)
    u = torch.rand(draws, draws_per_step(config, probs.shape[-1]), generator=generator)
    chosen = choose_from_probs(probs.repeat(draws, 1), config, u, static=static)
    return torch.bincount(chosen, minlength=probs.shape[-1]).float() / draws


def test_top_k_and_top_p_keep_the_right_tokens():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert kept(probs, 0.75) == [0, 1]  # 0.5 < 0.75, 0.8 >= 0.75
    assert kept(probs, 0.1) == [0]  # the top token always stays
    assert kept(probs[:, [2, 0, 3, 1]], 0.75) == [1, 3]
    assert kept(probs * 7.0, 0.75) == [0, 1]  # unnormalized is fine
    assert drawn(probs, SamplingConfig(top_k=2)).nonzero().flatten().tolist() == [0, 1]
    top3_then_p = drawn(probs, SamplingConfig(top_k=3, top_p=0.6))  # top-p on the renormalized 3
    torch.testing.assert_close(top3_then_p, torch.tensor([0.625, 0.375, 0, 0]), atol=0.01, rtol=0)


def test_nucleus_without_sorting_matches_a_full_sort_on_flat_and_peaked_distributions():
    torch.manual_seed(0)
    flat = (torch.randn(8, 1000) * 0.01).softmax(-1)  # the nucleus spans most of the vocabulary
    peaked = (torch.randn(8, 1000) * 8.0).softmax(-1)  # the nucleus is a handful of tokens
    for probs in (flat, peaked):
        for row in probs:
            assert kept(row[None], 0.9) == kept_by_sort(row, 0.9)


@pytest.mark.parametrize("max_draws", [8, 1])  # 1: most rows take the full-sort fallback
@pytest.mark.parametrize("static", [False, True])
def test_nucleus_draws_follow_the_renormalized_nucleus(monkeypatch, max_draws, static):
    monkeypatch.setattr(sampler, "NUCLEUS_DRAWS", max_draws)
    probs = torch.tensor([[0.1, 0.4, 0.05, 0.3, 0.15]])
    expected = torch.tensor([0.0, 0.4, 0.0, 0.3, 0.15]) / 0.85  # 0.4 + 0.3 < 0.8 <= 0.85
    draws = drawn(probs, SamplingConfig(top_p=0.8), static=static)
    torch.testing.assert_close(draws, expected, atol=0.01, rtol=0)


@pytest.mark.parametrize("max_draws", [8, 1])  # 1: most rows take the full-sort fallback
@pytest.mark.parametrize("static", [False, True])
def test_tied_tokens_at_the_nucleus_edge_are_in_or_out_together(monkeypatch, max_draws, static):
    """One rule on both paths: the tokens strictly more likely than a token hold less than
    top_p, so two tokens tied at the edge both stay, whatever order a sort puts them in."""
    monkeypatch.setattr(sampler, "NUCLEUS_DRAWS", max_draws)
    probs = torch.tensor([[0.3, 0.4, 0.3]])
    assert kept(probs, 0.5) == kept_by_sort(probs[0], 0.5) == [0, 1, 2]
    assert kept(probs, 0.4) == kept_by_sort(probs[0], 0.4) == [1]
    draws = drawn(probs, SamplingConfig(top_p=0.5), static=static)
    torch.testing.assert_close(draws, probs[0], atol=0.01, rtol=0)
    ties = torch.tensor([[0.25, 0.25, 0.25, 0.25]])
    assert kept_by_sort(ties[0], 0.1) == kept(ties, 0.1) == [0, 1, 2, 3]


def test_inverse_cdf_sampling_follows_the_distribution_and_skips_zero_mass():
    probs = torch.tensor([[0.0, 0.2, 0.0, 0.6, 0.2]]).repeat(20_000, 1)
    u = torch.rand(len(probs), 1, generator=torch.Generator().manual_seed(0))
    draws = sample_from(probs * 3.0, u)  # unnormalized is fine
    counts = torch.bincount(draws, minlength=5).float() / len(draws)
    assert counts[0] == counts[2] == 0
    torch.testing.assert_close(counts, probs[0], atol=0.01, rtol=0)


def test_long_prompts_keep_their_end(model):
    long_prompt = list(range(3, 58))  # 55 tokens > block_size - max_new_tokens
    out = generate(
        model, [long_prompt], eos_id=EOS, pad_id=PAD, config=SamplingConfig(max_new_tokens=8)
    )
    assert out.prompt.shape[1] == 40
    assert out.prompt[0].tolist() == long_prompt[-40:]


def test_left_pad():
    ids, mask = left_pad([[1, 2], [3]], pad_id=0)
    assert ids.tolist() == [[1, 2], [0, 3]]
    assert mask.tolist() == [[True, True], [False, True]]


def test_invalid_sampling_settings():
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=0)


def test_ids_past_the_tokenizer_are_never_drawn_and_log_probs_stay_the_models(model):
    """An embedding padded past its tokenizer (Qwen's 151,936 rows for 151,665 tokens): with
    `decodable` 40 of the 60 ids, a model that favours id 55 never draws it (its text could not
    be decoded), and the recorded log-probs are still the full forward's."""
    with torch.no_grad():
        model.ln_f.bias[0] = 1.0
        model.lm_head.weight[55, 0] = 6.0
    config = SamplingConfig(max_new_tokens=12)
    unbounded = run(model, config)
    assert (unbounded.tokens == 55).float().mean() > 0.5
    out = generate(
        model, PROMPTS, eos_id=EOS, pad_id=PAD, config=config,
        generator=torch.Generator().manual_seed(0), decodable=40,
    )  # fmt: skip
    assert int(out.tokens[out.mask].max()) < 40
    ids = torch.cat([out.prompt, out.tokens], dim=1)
    mask = torch.cat([out.prompt_mask, out.mask], dim=1)
    with torch.no_grad():
        recomputed = response_forward(model, ids, mask, out.prompt.shape[1])
    torch.testing.assert_close(
        recomputed.logprobs[out.mask], out.logprobs[out.mask], atol=1e-4, rtol=0
    )
