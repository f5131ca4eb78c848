"""The group-based variants of issue 50, each against a hand-computed example: loss
aggregation (GRPO's answer mean, DAPO's token mean, Dr. GRPO's fixed length), advantages without
the group std (Dr. GRPO), clip-higher (DAPO), overlong shaping (DAPO) and the sequence-level
importance ratio (GSPO)."""

import math

import pytest
import torch

from rlhf.algorithms.rl.advantages import grpo_advantages, overlong_penalty
from rlhf.algorithms.rl.losses import (
    aggregate,
    clipped_policy_loss,
    clipped_value_loss,
    sequence_log_ratio,
    token_weights,
)
from rlhf.params.groups import GRPOParams

# two answers: 3 tokens of loss 1, 2, 3 and 1 token of loss 10 (padding poisoned with inf)
LOSS = torch.tensor([[1.0, 2.0, 3.0], [10.0, math.inf, math.nan]])
MASK = torch.tensor([[True, True, True], [True, False, False]])


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        ("token_mean", (1 + 2 + 3 + 10) / 4),  # DAPO: every token alike
        ("answer_mean", ((1 + 2 + 3) / 3 + 10 / 1) / 2),  # GRPO: each answer's mean, averaged
        ("fixed_length", ((1 + 2 + 3) / 8 + 10 / 8) / 2),  # Dr. GRPO: sums over max_new_tokens 8
    ],
)
def test_loss_aggregations_by_hand(aggregation, expected):
    weights = token_weights(MASK, aggregation, max_new_tokens=8)
    assert aggregate(LOSS, MASK, weights).item() == pytest.approx(expected, rel=1e-6)


def test_answer_mean_weighs_microbatches_by_answers_so_parts_add_up_to_the_whole():
    """The trainer weighs each microbatch by its share of the minibatch's answers: the two
    one-answer parts, each at weight 1/2, give the whole minibatch's loss."""
    whole = aggregate(LOSS, MASK, token_weights(MASK, "answer_mean", 8))
    parts = sum(
        0.5
        * aggregate(
            LOSS[i : i + 1], MASK[i : i + 1], token_weights(MASK[i : i + 1], "answer_mean", 8)
        )
        for i in range(2)
    )
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def test_the_critics_loss_is_added_up_as_the_policys_so_microbatching_cannot_change_it():
    """Answers of 1 token (squared error 4) and of 3 (error 0): per answer, 0.5 * (4 + 0) / 2,
    whether the two answers are one microbatch or two, each weighed by its share of answers."""
    values, returns = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), torch.zeros(2, 3)
    mask = torch.tensor([[True, False, False], [True, True, True]])

    def loss(rows: slice) -> float:
        part = mask[rows]
        weights = token_weights(part, "answer_mean", max_new_tokens=8)
        return clipped_value_loss(values[rows], values[rows], returns[rows], part, 0.2, weights)[
            0
        ].item()

    assert loss(slice(0, 2)) == pytest.approx(1.0)
    assert 0.5 * loss(slice(0, 1)) + 0.5 * loss(slice(1, 2)) == pytest.approx(1.0)


def test_group_advantages_with_and_without_the_group_std():
    """Scores 1, 0, 0, 0 in one group of four: mean 0.25, unbiased std 0.5."""
    rewards = torch.zeros(4, 2)
    rewards[0, 1] = 1.0
    mask = torch.ones(4, 2, dtype=torch.bool)
    grpo, _ = grpo_advantages(rewards, None, mask, GRPOParams(group_size=4))
    dr_grpo, _ = grpo_advantages(rewards, None, mask, GRPOParams(group_size=4, std_normalize=False))
    torch.testing.assert_close(dr_grpo[:, 0], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    torch.testing.assert_close(grpo[:, 0], torch.tensor([0.75, -0.25, -0.25, -0.25]) / 0.5001)


def test_clip_higher_lets_a_positive_advantage_ratio_rise_further():
    """Ratio 1.25 with advantage 1: clipped at 1.2 symmetrically, free under clip-higher 0.28;
    ratio 0.7 with advantage -1 is clipped at the lower bound 0.8 either way."""
    new = torch.log(torch.tensor([[1.25, 0.7]]))
    old, adv, mask = torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2).bool()
    symmetric = clipped_policy_loss(new, old, adv, mask, 0.2)
    higher = clipped_policy_loss(new, old, adv, mask, 0.2, clip_high=0.28)
    assert symmetric.loss.item() == pytest.approx((-1.2 + 0.8) / 2, rel=1e-6)
    assert higher.loss.item() == pytest.approx((-1.25 + 0.8) / 2, rel=1e-6)
    assert higher.clip_fraction.item() == 0.5 and symmetric.clip_fraction.item() == 1.0


def test_overlong_penalty_ramps_over_the_buffer():
    lengths = torch.tensor([10, 12, 14, 16])
    penalty = overlong_penalty(lengths, max_new_tokens=16, buffer=4, penalty=0.5)
    torch.testing.assert_close(penalty, torch.tensor([0.0, 0.0, 0.25, 0.5]))


def test_the_sequence_ratio_is_the_answers_geometric_mean_and_carries_its_gradient():
    """GSPO: log-ratios 0.2 and -0.1 on an answer of two tokens give every token the ratio
    exp(0.05); its gradient per token is that of the answer's mean log-prob."""
    old = torch.zeros(1, 3)
    new = torch.tensor([[0.2, -0.1, 5.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False]])
    log_ratio = sequence_log_ratio(new, old, mask)
    torch.testing.assert_close(log_ratio[0, :2].detach(), torch.tensor([0.05, 0.05]))
    out = clipped_policy_loss(new, old, torch.ones(1, 3), mask, 0.2, sequence_ratio=True)
    assert out.loss.item() == pytest.approx(-math.exp(0.05), rel=1e-6)
    out.loss.backward()
    # d/dnew of -(1/2) sum_t exp(0.05) * exp(new_t - sg(new_t)) = -exp(0.05) / 2 per real token
    torch.testing.assert_close(new.grad, torch.tensor([[-math.exp(0.05) / 2] * 2 + [0.0]]))
