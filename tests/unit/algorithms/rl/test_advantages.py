"""Advantage estimators against hand-worked examples: GAE, the baselines of REINFORCE, RLOO
and GRPO, and where the reward sits."""

import torch

from rlhf.algorithms.rl.advantages import (
    baseline_advantages,
    gae,
    grpo_advantages,
    rloo_advantages,
    token_rewards,
)
from rlhf.algorithms.rl.losses import (
    whiten,
)
from rlhf.params.groups import GRPOParams, ReinforceParams, RLOOParams

GROUP_MASK = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 0]]).bool()


def test_gae_against_a_hand_worked_example():
    # one response of 3 tokens then padding; gamma 0.9, lambda 0.5
    rewards = torch.tensor([[0.0, 0.0, 1.0, 7.0]])  # the 7 sits on padding and must be ignored
    values = torch.tensor([[0.5, 0.2, 0.4, 9.0]])
    mask = torch.tensor([[True, True, True, False]])
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    d2 = 1.0 + 0.9 * 0.0 - 0.4  # the last token: its successor's value is 0
    d1 = 0.0 + 0.9 * 0.4 - 0.2
    d0 = 0.0 + 0.9 * 0.2 - 0.5
    a2 = d2
    a1 = d1 + 0.45 * a2
    a0 = d0 + 0.45 * a1
    torch.testing.assert_close(advantages, torch.tensor([[a0, a1, a2, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[a0 + 0.5, a1 + 0.2, a2 + 0.4, 0.0]]))


def test_gae_with_gamma_and_lambda_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.1, -0.2, 0.3, 1.0], [0.5, 2.0, 0.0, 0.0]])
    values = torch.tensor([[0.3, 0.1, 0.0, 0.2], [1.0, 0.4, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]).bool()
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    to_go = torch.tensor([[1.2, 1.1, 1.3, 1.0], [2.5, 2.0, 0.0, 0.0]])
    torch.testing.assert_close(returns, to_go)
    torch.testing.assert_close(advantages, (to_go - values) * mask)


def test_reward_sits_on_the_last_real_token_under_left_padded_prompts():
    # responses of length 3 and 1 (then padding); the KL penalty covers every response token
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]).bool()
    penalty = torch.tensor([[-0.05, -0.1, -0.15, 0], [-0.25, 0, 0, 0]])
    rewards = token_rewards(torch.tensor([2.0, -1.0]), penalty, mask)
    torch.testing.assert_close(
        rewards, torch.tensor([[-0.05, -0.1, 1.85, 0.0], [-1.25, 0.0, 0.0, 0.0]])
    )


def test_reinforce_has_one_advantage_per_answer():
    """Return = score + every token's KL penalty; the baseline is the value before token 0."""
    rewards = torch.tensor([[-0.1, -0.2, 1.0, 0.0], [0.3, 2.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.1, 0.9, 0.0], [-1.0, 0.4, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]).bool()
    advantages, returns = baseline_advantages(rewards, values, mask, ReinforceParams())
    raw = torch.tensor([[0.2] * 3 + [0.0], [3.3] * 2 + [0.0] * 2])
    torch.testing.assert_close(advantages, whiten(raw, mask))
    torch.testing.assert_close(returns, torch.tensor([[0.7, 0.8, 1.0, 0.0], [2.3, 2.0, 0.0, 0.0]]))


def test_rloo_baseline_is_the_mean_return_of_the_other_answers():
    # returns: score on the last token plus a KL penalty on every token
    rewards = torch.tensor(
        [[-0.1, 1.0], [0.5, 9.0], [0.0, 0.2], [0.0, 0.0], [0.1, 0.3], [2.0, 0.0]]
    )
    advantages, returns = rloo_advantages(rewards, None, GROUP_MASK, RLOOParams(group_size=3))
    totals = [0.9, 0.5, 0.2, 0.0, 0.4, 2.0]  # padding (the 9.0) never counts
    expected = []
    for g in (0, 3):
        for i in range(3):
            others = [totals[g + j] for j in range(3) if j != i]
            expected.append(totals[g + i] - sum(others) / 2)
    want = torch.tensor(expected)[:, None].expand(6, 2) * GROUP_MASK
    torch.testing.assert_close(advantages, want)
    assert returns is None
    # each group's advantages sum to zero: the baseline is unbiased and centres the group
    torch.testing.assert_close(advantages[:, 0].view(2, 3).sum(-1), torch.zeros(2))


def test_grpo_standardizes_scores_within_each_prompts_group():
    scores = torch.tensor([1.0, 0.0, 0.5, 0.7, 0.7, 0.7])  # the second group all ties
    rewards = token_rewards(scores, torch.zeros(6, 2), GROUP_MASK)  # no KL in GRPO's reward
    advantages, returns = grpo_advantages(rewards, None, GROUP_MASK, GRPOParams(group_size=3))
    first = (torch.tensor([1.0, 0.0, 0.5]) - 0.5) / (0.5 + 1e-4)  # unbiased std of 1, 0, 0.5
    torch.testing.assert_close(advantages[:3, 0], first)
    assert advantages[3:].abs().sum() == 0  # all-equal scores: no signal
    assert (advantages[~GROUP_MASK] == 0).all() and returns is None
