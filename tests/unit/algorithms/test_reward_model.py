import itertools
import math

import pytest
import torch

from rlhf.algorithms.reward_model import (
    group_loss,
    mean_group_loss,
    normalize,
    pooled_rewards,
    ranking_loss,
    score,
)
from rlhf.data.batching import sequence_batch
from rlhf.data.comparisons import EncodedGroup, encode_groups, ranking_pairs
from rlhf.eval.rm_accuracy import comparison_metrics
from rlhf.models.gpt import GPT, GPTConfig
from rlhf.synthetic.labelers import disagreement, rank_with_noise
from rlhf.tokenizer.chat import Example, encode_example
from rlhf.tokenizer.tokenizer import save_tokenizer
from rlhf.train.batches import batch_order


def logsig(x: float) -> float:
    return -math.log1p(math.exp(-x))


def group(ranks: list[int], rows: list[int] | None = None) -> EncodedGroup:
    """A prompt's ranking over distinct answers `rows` (by default each answer its own)."""
    rows = rows if rows is not None else list(range(len(ranks)))
    return EncodedGroup([Example([0], 0)] * (max(rows) + 1), rows, ranks)


def test_k_way_loss_is_the_mean_of_its_pairwise_terms_by_hand():
    # prompt A: K = 3, ranks say 1 > 2 > 0 (rank 0 best); prompt B: a plain pair, 1 preferred
    rewards = torch.tensor([0.3, 1.2, -0.5, 0.0, 0.7])
    pairs = ranking_pairs([group([2, 0, 1]), group([1, 0])])
    a = [(1.2, 0.3), (1.2, -0.5), (-0.5, 0.3)]  # (better, worse) rewards
    prompt_a = sum(-logsig(b - w) for b, w in a) / 3
    prompt_b = -logsig(0.7 - 0.0)
    expected = (prompt_a + prompt_b) / 2
    assert ranking_loss(rewards, pairs).item() == pytest.approx(expected, rel=1e-6)


def test_equal_ranks_give_no_pair():
    pairs = ranking_pairs([group([0, 0, 1])])
    assert sorted(zip(pairs.better.tolist(), pairs.worse.tolist(), strict=True)) == [(0, 2), (1, 2)]
    assert pairs.weight.tolist() == pytest.approx([0.5, 0.5])


def test_copies_of_one_answer_give_no_pair_and_a_prompt_of_copies_drops_out():
    # prompt A: x, y, x (x forwarded once, as row 0) ranked 0, 1, 2: x > y and y > x, but no
    # pair between the two copies of x; prompt B: z twice, nothing to learn from
    pairs = ranking_pairs([group([0, 1, 2], [0, 1, 0]), group([0, 1], [0, 0])])
    assert list(zip(pairs.better.tolist(), pairs.worse.tolist(), strict=True)) == [(0, 1), (1, 0)]
    assert pairs.weight.tolist() == pytest.approx([0.5, 0.5])  # A alone makes the average
    rewards = torch.tensor([0.3, 1.2, 7.0])  # row 2 is B's z
    expected = (-logsig(0.3 - 1.2) - logsig(1.2 - 0.3)) / 2
    assert ranking_loss(rewards, pairs).item() == pytest.approx(expected, rel=1e-6)
    # a batch of copies alone has no pair and no loss
    assert ranking_loss(rewards[:1], ranking_pairs([group([0, 1], [0, 0])])).item() == 0.0


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("t"), "bytes")


@pytest.fixture
def model(tok):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2, n_embd=16))


def test_each_response_is_forwarded_once(model, tok, monkeypatch):
    rows_seen = []
    original = model.packed_hidden_states

    def counting_hidden(packed):
        segments = packed.segments
        rows_seen.append(len(segments[segments >= 0].unique()))  # rows packed in the forward
        return original(packed)

    monkeypatch.setattr(model, "packed_hidden_states", counting_hidden)
    rows = [
        {"prompt": "p1", "responses": ["a", "b", "c", "d"], "ranks": [0, 1, 2, 3]},
        {"prompt": "p2", "responses": ["e", "f", "g"], "ranks": [2, 1, 0]},
    ]
    groups = encode_groups(tok, rows, 64)
    loss, _ = group_loss(model, groups, tok.pad_id, "last")
    assert rows_seen == [7]  # 4 + 3 responses in one forward, not 2 per each of 6 + 3 pairs
    rows_seen.clear()
    repeated = [{"prompt": "p", "responses": ["a", "b", "a", "a"], "ranks": [0, 1, 2, 3]}]
    group_loss(model, encode_groups(tok, repeated, 64), tok.pad_id, "last")
    assert rows_seen == [2]  # a sampled answer that recurs is forwarded once
    loss.backward()
    assert model.reward_head.weight.grad is not None


def test_last_pooling_reads_the_end_token_and_mean_averages_the_response(model, tok):
    examples = [encode_example(tok, p, r, 64) for p, r in (("ab", "xyz"), ("abcdef", "q"))]
    batch = sequence_batch(examples, tok.pad_id)
    assert batch.ids[0, batch.lengths[0] - 1] == tok.eos_id
    assert batch.ids[1, batch.lengths[1] - 1] == tok.eos_id
    per_token = model.rewards(model.hidden_states(batch.ids))
    last = pooled_rewards(model, batch, "last")
    torch.testing.assert_close(last[0], per_token[0, batch.lengths[0] - 1])
    mean = pooled_rewards(model, batch, "mean")
    torch.testing.assert_close(mean[1], per_token[1, 8:10].mean())  # "q" and the end token


def test_scoring_is_batch_independent_and_normalization_centres(model, tok):
    prompts, responses = ["p"] * 5, ["a", "bb", "ccc", "dddd", "e"]
    together = score(model, tok, prompts, responses, pooling="last", batch_size=8)
    one_by_one = score(model, tok, prompts, responses, pooling="last", batch_size=1)
    torch.testing.assert_close(together, one_by_one, atol=1e-5, rtol=0)
    shift, std = normalize(model, together)
    after = score(model, tok, prompts, responses, pooling="last")
    assert after.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert std == pytest.approx(together.std().item())
    assert shift == pytest.approx(together.mean().item())


def test_labeler_noise_hits_its_target_and_large_margins_flip_less():
    gen = torch.Generator().manual_seed(0)
    gold = (torch.rand(3000, 4, generator=gen) * 10).round() / 10
    labels = rank_with_noise(gold.tolist(), 0.25, seed=1)
    assert labels.flip_share == pytest.approx(0.25, abs=0.002)
    assert all(sorted(r) == [0, 1, 2, 3] for r in labels.ranks)
    flips = {"small": [], "large": []}
    for g, r in zip(gold.tolist(), labels.ranks, strict=True):
        for i in range(4):
            for j in range(i + 1, 4):
                if g[i] != g[j]:
                    bucket = "large" if abs(g[i] - g[j]) >= 0.5 else "small"
                    flips[bucket].append((g[i] > g[j]) != (r[i] < r[j]))
    assert sum(flips["large"]) / len(flips["large"]) < sum(flips["small"]) / len(flips["small"])
    clean = rank_with_noise(gold.tolist(), 0.0, seed=1)
    flips, ties = disagreement(gold.tolist(), labels.ranks)
    assert clean.flip_share == 0.0 and flips == labels.flip_share and 0 < ties < 1


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("rows", "target"), [(12, 0.25), (150, 0.25), (900, 0.1), (400, 0.4)])
def test_the_realised_flip_share_is_the_target_on_any_data(rows, target, seed):
    """Calibrated on the draws the ranking uses: the flip share among each row's sampled
    answers (the first ones; mismatched answers follow) is the target up to one pair."""
    gen = torch.Generator().manual_seed(seed)
    sampled = torch.randint(2, 5, (rows,), generator=gen).tolist()
    extra = torch.randint(0, 3, (rows,), generator=gen).tolist()
    gold = [
        ((torch.rand(n + m, generator=gen) * 10).round() / 10).tolist()
        for n, m in zip(sampled, extra, strict=True)
    ]
    labels = rank_with_noise(gold, target, seed, calibrated_on=sampled)
    own = [row[:n] for row, n in zip(gold, sampled, strict=True)]
    flips, _ = disagreement(own, [r[:n] for r, n in zip(labels.ranks, sampled, strict=True)])
    distinct = sum(a != b for row in own for a, b in itertools.combinations(row, 2))
    assert abs(flips - target) <= 1 / distinct + 1e-4


def test_disagreement_by_hand():
    # pairs: (0,1) gold 1 > 0.5, ranked so: agrees; (0,2) tie; (1,2) 0.5 ranked over 1: flipped
    assert disagreement([[1.0, 0.5, 1.0]], [[0, 1, 2]]) == (0.5, pytest.approx(1 / 3, abs=1e-4))


def test_comparison_metrics_by_hand():
    rows = [
        {"ranks": [0, 1, 2], "gold_scores": [1.0, 0.9, 0.0], "task": "a"},
        {"ranks": [1, 0], "gold_scores": [0.5, 0.5], "task": "b"},
    ]
    rewards = [[3.0, 1.0, 2.0], [0.0, 1.0]]
    m = comparison_metrics(rows, rewards, [1, 2, 3, 4, 5])
    # noisy pairs: (0>1 ok), (0>2 ok), (1>2 wrong), (row 2: 1>0 ok) -> 3/4
    assert m["acc_noisy"] == 0.75
    # gold pairs with distinct scores: (0,1) m=0.1 ok, (0,2) m=1.0 ok, (1,2) m=0.9 wrong
    assert m["acc_gold"] == pytest.approx(0.6667, abs=1e-4)
    assert m["acc_gold_margin_ge_0_2"] == 0.5
    assert m["acc_gold_by_margin"]["0.1-0.2"] == 1.0
    assert m["acc_gold_by_margin"]["0.5-1"] == 0.5
    assert m["acc_gold_by_margin"]["0-0.1"] is None
    assert m["acc_gold_by_task"] == {"a": pytest.approx(0.6667, abs=1e-4)}


def test_chunked_validation_loss_equals_one_big_batch(model, tok):
    rows = [
        {
            "prompt": f"p{i}",
            "responses": ["a" * i, "b", "cc"],
            "ranks": [i % 3, (i + 1) % 3, (i + 2) % 3],
        }
        for i in range(1, 8)
    ]
    groups = encode_groups(tok, rows, 64)
    whole = group_loss(model, groups, tok.pad_id, "last")[0].item()
    assert mean_group_loss(model, groups, tok.pad_id, "last", chunk=3) == pytest.approx(
        whole, rel=1e-5
    )


def test_length_buckets_are_a_seeded_permutation_of_similar_length_batches():
    lengths = [(i * 37) % 101 for i in range(1000)]
    order = batch_order(1000, seed=3, epoch=1, lengths=lengths, batch_size=16)
    assert sorted(order) == list(range(1000))
    assert order == batch_order(1000, seed=3, epoch=1, lengths=lengths, batch_size=16)
    assert order != batch_order(1000, seed=3, epoch=2, lengths=lengths, batch_size=16)
    batches = [order[i : i + 16] for i in range(0, 1000, 16)]
    assert len(batches[-1]) == 1000 % 16  # the partial batch stays last: every slice is a batch

    def padded(batch: list[int]) -> int:
        return max(lengths[i] for i in batch) * len(batch)

    bucketed = sum(padded(b) for b in batches)
    shuffled = batch_order(1000, seed=3, epoch=1)
    plain = sum(padded(shuffled[i : i + 16]) for i in range(0, 1000, 16))
    assert sum(lengths) / bucketed > 0.9 > sum(lengths) / plain
    # batches are not in length order: training still sees short and long ones interleaved
    means = [sum(lengths[i] for i in b) / len(b) for b in batches[:-1]]
    assert means != sorted(means)
