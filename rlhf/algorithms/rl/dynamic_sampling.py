"""DAPO's dynamic sampling (Yu et al. 2025): a group whose answers all earn the same reward has
zero advantage under group normalization, so it gives the update no gradient, only tokens that
dilute the token mean. With `max_sampling_rounds` above 1, an iteration keeps only the groups
with an advantage (their rewards, penalties included, differ) and samples further prompts, a
round at a time, until `batch_size` such groups are in hand or the rounds run out; a round
draws its prompts from its own seeded shuffle, so a resumed run samples exactly what the run
it resumes did.

Every rank holds the whole batch's scores (`shards.whole_batch`), so all decide alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from rlhf.algorithms.rl.experience import Experience
from rlhf.algorithms.rl.shards import widened
from rlhf.sampling.rollout import Rollout


def informative_groups(advantages: Tensor, group_size: int) -> list[int]:
    """The groups (consecutive `group_size` rows of advantages [B, N]) with an advantage: the
    rewards the advantages came from, penalties included, are not all equal."""
    grouped = advantages.abs().amax(-1).view(-1, group_size)  # [G, k]
    return (grouped.amax(-1) > 0).nonzero().flatten().tolist()


def group_rows(groups: list[int], group_size: int) -> list[int]:
    return [g * group_size + i for g in groups for i in range(group_size)]


def _rows(tensor: Tensor | None, rows: Tensor) -> Tensor | None:
    return None if tensor is None else tensor[rows]


def subset(experience: Experience, rows: list[int]) -> Experience:
    """The experience of `rows` alone, in that order."""
    index = torch.tensor(rows, device=experience.scores.device)
    rollout = experience.rollout
    kept = dataclasses.replace(
        rollout,
        prompts=[rollout.prompts[i] for i in rows],
        responses=[rollout.responses[i] for i in rows],
        sequences=rollout.sequences[index],
        attention_mask=rollout.attention_mask[index],
        response_mask=rollout.response_mask[index],
        logprobs=rollout.logprobs[index],
        ended=rollout.ended[index],
    )
    return Experience(
        rollout=kept,
        old_logprobs=experience.old_logprobs[index],
        ref_logprobs=experience.ref_logprobs[index],
        scores=experience.scores[index],
        advantages=experience.advantages[index],
        values=_rows(experience.values, index),
        returns=_rows(experience.returns, index),
    )


def _right_padded(tensor: Tensor | None, width: int, fill: float | bool | int) -> Tensor | None:
    """[B, N] padded on the right to [B, width] with `fill`."""
    if tensor is None:
        return None
    pad = tensor.new_full((tensor.shape[0], width - tensor.shape[1]), fill)
    return torch.cat([tensor, pad], dim=1)


def _responses_widened(experience: Experience, width: int, pad_id: int) -> Experience:
    """The experience with every response tensor right-padded to `width` columns: padding
    is masked out, as `sample_rollout` pads."""
    rollout = experience.rollout
    extra = width - rollout.response_mask.shape[1]
    if extra == 0:
        return experience
    padded = dataclasses.replace(
        rollout,
        sequences=_right_padded(rollout.sequences, rollout.sequences.shape[1] + extra, pad_id),
        attention_mask=_right_padded(
            rollout.attention_mask, rollout.attention_mask.shape[1] + extra, False
        ),
        response_mask=_right_padded(rollout.response_mask, width, False),
        logprobs=_right_padded(rollout.logprobs, width, 0.0),
    )
    return Experience(
        rollout=padded,
        old_logprobs=_right_padded(experience.old_logprobs, width, 0.0),
        ref_logprobs=_right_padded(experience.ref_logprobs, width, 0.0),
        scores=experience.scores,
        advantages=_right_padded(experience.advantages, width, 0.0),
        values=_right_padded(experience.values, width, 0.0),
        returns=_right_padded(experience.returns, width, 0.0),
    )


def concatenated(first: Experience, second: Experience, pad_id: int) -> Experience:
    """Both experiences' rows as one batch: prompts left-padded to the wider, responses
    right-padded to the longer."""
    prompt_width = max(first.rollout.prompt_width, second.rollout.prompt_width)
    response_width = max(
        first.rollout.response_mask.shape[1], second.rollout.response_mask.shape[1]
    )
    parts = [
        _responses_widened(
            dataclasses.replace(e, rollout=widened(e.rollout, prompt_width, pad_id)),
            response_width,
            pad_id,
        )
        for e in (first, second)
    ]
    a, b = parts

    def cat(x: Tensor | None, y: Tensor | None) -> Tensor | None:
        return None if x is None or y is None else torch.cat([x, y])

    rollout = Rollout(
        prompts=a.rollout.prompts + b.rollout.prompts,
        responses=a.rollout.responses + b.rollout.responses,
        sequences=torch.cat([a.rollout.sequences, b.rollout.sequences]),
        attention_mask=torch.cat([a.rollout.attention_mask, b.rollout.attention_mask]),
        response_mask=torch.cat([a.rollout.response_mask, b.rollout.response_mask]),
        logprobs=torch.cat([a.rollout.logprobs, b.rollout.logprobs]),
        ended=torch.cat([a.rollout.ended, b.rollout.ended]),
        prompt_width=prompt_width,
    )
    return Experience(
        rollout=rollout,
        old_logprobs=torch.cat([a.old_logprobs, b.old_logprobs]),
        ref_logprobs=torch.cat([a.ref_logprobs, b.ref_logprobs]),
        scores=torch.cat([a.scores, b.scores]),
        advantages=torch.cat([a.advantages, b.advantages]),
        values=cat(a.values, b.values),
        returns=cat(a.returns, b.returns),
    )


def informative_batch(
    sample: Callable[[int], Experience],
    batch_size: int,
    group_size: int,
    rounds: int,
    pad_id: int,
) -> tuple[Experience, dict[str, float]]:
    """The iteration's experience of at most `batch_size` informative groups, from up to
    `rounds` rollouts (`sample(round)`, round 0 the iteration's own prompts); the first
    rollout whole where no round gave one informative group (its update then only moves the
    KL term). Returns it and how many rounds ran and groups were kept."""
    kept: Experience | None = None
    first: Experience | None = None
    found = ran = 0
    for round_ in range(rounds):
        experience = sample(round_)
        ran += 1
        if first is None:
            first = experience
        groups = informative_groups(experience.advantages, group_size)[: batch_size - found]
        if groups:
            chosen = subset(experience, group_rows(groups, group_size))
            kept = chosen if kept is None else concatenated(kept, chosen, pad_id)
            found += len(groups)
        if found == batch_size:
            break
    assert first is not None
    stats = {"sampling_rounds": float(ran), "informative_groups": float(found)}
    return (kept if kept is not None else first), stats
