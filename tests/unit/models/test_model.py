import pytest
import torch

from rlhf.models.gpt import GPT, GPTConfig
from rlhf.models.packing import bin_mask, pack, packed_hidden_states, positions

CONFIG = GPTConfig(vocab_size=97, block_size=40, n_layer=2, n_head=4, n_embd=32)


@pytest.fixture
def model():
    torch.manual_seed(0)
    return GPT(CONFIG).eval()


def test_kv_cache_decoding_matches_full_forward(model):
    ids = torch.randint(0, CONFIG.vocab_size, (3, 20))
    full = model(ids)
    cache = model.new_cache(3, 20, torch.device("cpu"))
    pieces = [model(ids[:, :7], cache=cache)]
    pieces += [model(ids[:, t : t + 1], cache=cache) for t in range(7, 20)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=0)


def test_left_padded_batch_matches_each_row_alone(model):
    rows = [torch.randint(0, CONFIG.vocab_size, (n,)) for n in (5, 12, 9)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = row
        mask[i, width - len(row) :] = True
    batched = model(ids, mask)
    assert torch.isfinite(batched).all()  # pad queries must not produce NaN
    for i, row in enumerate(rows):
        alone = model(row[None])
        torch.testing.assert_close(batched[i, width - len(row) :], alone[0], atol=1e-5, rtol=0)


def test_left_padded_incremental_decoding_matches_rows_alone(model):
    rows = [torch.randint(0, CONFIG.vocab_size, (n,)) for n in (4, 10)]
    extra = torch.randint(0, CONFIG.vocab_size, (2, 5))
    ids = torch.zeros(2, 10, dtype=torch.long)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, 10 - len(row) :] = row
        mask[i, 10 - len(row) :] = True
    cache = model.new_cache(2, 15, torch.device("cpu"))
    model(ids, mask, cache)
    steps = [
        model(extra[:, t : t + 1], torch.ones(2, 1, dtype=torch.bool), cache) for t in range(5)
    ]
    decoded = torch.cat(steps, dim=1)
    for i, row in enumerate(rows):
        alone = model(torch.cat([row, extra[i]])[None])[0, len(row) :]
        torch.testing.assert_close(decoded[i], alone, atol=1e-5, rtol=0)


def test_heads_and_tied_embeddings(model):
    ids = torch.randint(0, CONFIG.vocab_size, (2, 6))
    hidden = model.hidden_states(ids)
    assert hidden.shape == (2, 6, CONFIG.n_embd)
    assert model(ids).shape == (2, 6, CONFIG.vocab_size)
    assert model.values(hidden).shape == (2, 6)
    assert model.rewards(hidden).shape == (2, 6)
    assert model.lm_head.weight is model.wte.weight


def test_dropout_is_off_by_default():
    model = GPT(GPTConfig(vocab_size=11)).train()
    ids = torch.randint(0, 11, (2, 8))
    torch.testing.assert_close(model(ids), model(ids))  # deterministic in train mode
    assert GPTConfig(vocab_size=11).dropout == 0.0


def test_context_limits_are_enforced(model):
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, CONFIG.block_size + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="block_size"):
        model.new_cache(1, CONFIG.block_size + 1, torch.device("cpu"))


def rollout_like_batch(lengths: list[tuple[int, int]], width: tuple[int, int]):
    """Ids and real-token mask [B, P + N]: each row a left-padded prompt of p tokens and a
    response of r tokens padded after it, as a rollout lays them out."""
    prompt_width, response_width = width
    ids = torch.randint(0, CONFIG.vocab_size, (len(lengths), prompt_width + response_width))
    real = torch.zeros_like(ids, dtype=torch.bool)
    for row, (p, r) in enumerate(lengths):
        real[row, prompt_width - p : prompt_width + r] = True
    return ids, real


def test_packed_forward_matches_the_padded_one_at_every_real_token(model):
    ids, real = rollout_like_batch([(3, 9), (8, 2), (5, 5), (1, 1), (8, 9)], (8, 9))
    padded = model.hidden_states(ids, real)
    packed = packed_hidden_states(model, ids, real)
    torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=0)
    assert (packed[~real] == 0).all()


def test_packed_forward_gives_the_padded_gradients(model):
    ids, real = rollout_like_batch([(4, 6), (7, 1), (2, 8)], (7, 8))
    grads = []
    for forward in (model.hidden_states, lambda i, m: packed_hidden_states(model, i, m)):
        model.zero_grad()
        torch.where(real, model.values(forward(ids, real)), 0.0).square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for padded, packed in zip(*grads, strict=True):
        torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-4)


def test_packing_fills_bins_up_to_capacity_and_restarts_positions():
    ids = torch.arange(40).view(4, 10)
    real = torch.zeros_like(ids, dtype=torch.bool)
    for row, n in enumerate((10, 3, 6, 4)):
        real[row, 10 - n :] = True
    packing = pack(ids, real, capacity=10, lengths=[10, 3, 6, 4])
    assert packing.ids.shape == (3, 10)  # 10 | 6 + 4 | 3: the longest first, each where it fits
    assert sorted((packing.segments >= 0).sum(-1).tolist()) == [3, 10, 10]
    assert torch.equal(packing.ids.flatten()[packing.source][real], ids[real])
    mask, restarted = bin_mask(packing.segments), positions(packing.segments)
    for segment, n in enumerate((10, 3, 6, 4)):
        assert sorted(restarted[packing.segments == segment].tolist()) == list(range(n))
        rows = (packing.segments == segment).nonzero()
        bin_, columns = rows[0, 0], rows[:, 1]
        assert mask[bin_, 0][columns][:, columns].equal(torch.ones(n, n).tril().bool())
        assert mask[bin_, 0][columns].sum() == n * (n + 1) // 2  # nothing outside its row
