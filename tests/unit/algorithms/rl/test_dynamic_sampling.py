"""DAPO's dynamic sampling: groups scored alike dropped, further rounds sampled until the batch
is full, experiences of different widths joined as one batch."""

import torch

from rlhf.algorithms.rl.dynamic_sampling import (
    concatenated,
    informative_batch,
    informative_groups,
    subset,
)
from rlhf.algorithms.rl.experience import Experience
from rlhf.sampling.rollout import Rollout

PAD = 0


def experience(scores: list[float], prompt_width: int, response_width: int, tag: int) -> Experience:
    """Rows whose every id and log-prob is `tag` plus the row, fully real, each answer's
    advantage its score less its group's mean (groups of 2)."""
    rows = len(scores)
    fill = torch.arange(rows, dtype=torch.float32)[:, None] + tag  # [B, 1]
    width = prompt_width + response_width
    rollout = Rollout(
        prompts=[f"p{tag}.{i}" for i in range(rows)],
        responses=[f"r{tag}.{i}" for i in range(rows)],
        sequences=fill.long().expand(rows, width) + 1,
        attention_mask=torch.ones(rows, width, dtype=torch.bool),
        response_mask=torch.ones(rows, response_width, dtype=torch.bool),
        logprobs=fill.expand(rows, response_width).clone(),
        ended=torch.ones(rows, dtype=torch.bool),
        prompt_width=prompt_width,
    )
    per_token = fill.expand(rows, response_width).clone()
    grouped = torch.tensor(scores).view(-1, 2)
    advantages = (grouped - grouped.mean(-1, keepdim=True)).reshape(-1, 1)
    return Experience(
        rollout, per_token, per_token, torch.tensor(scores),
        advantages.expand(rows, response_width).clone(), None, None,
    )  # fmt: skip


def test_a_group_without_an_advantage_is_not_informative():
    """Groups of two rows: only the second has an advantage; as groups of four, the first. A
    group scored alike whose rewards a penalty set apart (a cut answer) has one too."""
    advantages = torch.tensor([0.0, 0.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0])[:, None].expand(8, 3)
    assert informative_groups(advantages, group_size=2) == [1]
    assert informative_groups(advantages, group_size=4) == [0]


def test_experiences_of_different_widths_join_padded_and_masked():
    a = experience([1.0, 0.0], prompt_width=3, response_width=2, tag=10)
    b = experience([0.0, 1.0], prompt_width=2, response_width=4, tag=20)
    joined = concatenated(a, b, PAD)
    rollout = joined.rollout
    assert rollout.prompt_width == 3 and rollout.response_mask.shape == (4, 4)
    assert rollout.prompts == ["p10.0", "p10.1", "p20.0", "p20.1"]
    # a's responses padded on the right, b's prompts on the left
    assert rollout.response_mask[:2].tolist() == [[True, True, False, False]] * 2
    assert rollout.attention_mask[2:].tolist() == [[False, True, True, True, True, True, True]] * 2
    assert rollout.sequences[:2, 5:].tolist() == [[PAD, PAD]] * 2
    assert joined.old_logprobs[:, :2].tolist() == [[10.0] * 2, [11.0] * 2, [20.0] * 2, [21.0] * 2]
    assert joined.advantages[:2, 2:].abs().sum() == 0 and joined.old_logprobs[:2, 2:].sum() == 0
    assert joined.scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert subset(joined, [3, 0]).rollout.prompts == ["p20.1", "p10.0"]


def test_rounds_sample_until_the_batch_is_full_and_keep_only_informative_groups():
    rounds = {  # groups of 2: round 0 has one informative group, round 1 two, round 2 one
        0: experience([1.0, 1.0, 0.0, 1.0], 3, 2, tag=0),
        1: experience([0.0, 1.0, 1.0, 0.0, 0.0, 0.0], 2, 3, tag=10),
        2: experience([0.0, 1.0], 2, 3, tag=20),
    }
    asked = []

    def sample(round_):
        asked.append(round_)
        return rounds[round_]

    batch, stats = informative_batch(sample, batch_size=2, group_size=2, rounds=3, pad_id=PAD)
    assert asked == [0, 1]  # full after two rounds: the third is never sampled
    assert batch.rollout.prompts == ["p0.2", "p0.3", "p10.0", "p10.1"]  # one group too many cut
    assert stats == {"sampling_rounds": 2.0, "informative_groups": 2.0}


def test_without_an_informative_group_the_first_rollout_is_kept_whole():
    tied = experience([1.0, 1.0, 0.0, 0.0], 3, 2, tag=0)
    batch, stats = informative_batch(lambda r: tied, 2, 2, rounds=2, pad_id=PAD)
    assert batch is tied and stats == {"sampling_rounds": 2.0, "informative_groups": 0.0}
