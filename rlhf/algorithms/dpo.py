"""Direct preference optimization (Rafailov et al. 2023), its IPO and conservative variants.

DPO needs no reward model and no sampling: the policy's log-ratio to a frozen reference,
log pi(y|x) - log pi_ref(y|x) summed over the response tokens, acts as an implicit reward
(times beta), and the loss is the reward model's pairwise loss on that implicit reward. Like
the reward model, each distinct response of a prompt is forwarded once and every ranked pair
of the prompt reuses it; each prompt weighs the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from rlhf.data.batching import SequenceBatch, sequence_batch
from rlhf.data.comparisons import EncodedGroup, ranking_pairs
from rlhf.models.backbone import Backbone
from rlhf.params.groups import DPOParams
from rlhf.sampling.forward import response_forward
from rlhf.train.device import autocast

LOSSES = ("sigmoid", "ipo")


def sequence_logprobs(model: Backbone, batch: SequenceBatch) -> Tensor:
    """log pi(response | prompt) per row [B]: the response tokens' log-probs, end token
    included."""
    ids = batch.ids.to(next(model.parameters()).device)
    start = int(batch.response_start.min())
    first, length = batch.response_start.to(ids.device), batch.lengths.to(ids.device)
    columns = torch.arange(ids.shape[1], device=ids.device)
    real = columns < length[:, None]  # [B, T]
    logprobs = response_forward(model, ids, real, start).logprobs  # [B, T - start]
    position = columns[start:]  # of each scored token
    in_response = (position >= first[:, None]) & (position < length[:, None])
    return torch.where(in_response, logprobs, 0.0).sum(-1)


def dpo_loss(
    chosen_logratio: Tensor,
    rejected_logratio: Tensor,
    *,
    beta: float,
    loss: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Per-pair loss [P] from the log-ratios to the reference of the preferred and the other
    response.

    `sigmoid`: -(1 - e) log sigmoid(beta h) - e log sigmoid(-beta h), h the difference of the
    log-ratios; e > 0 is conservative DPO, which treats each label as flipped with probability
    e and so stops pushing a pair apart once the policy is confident. `ipo`: (h - 1/(2 beta))^2
    (Azar et al. 2023), which regresses h to a fixed margin instead of driving it to infinity.
    """
    h = chosen_logratio - rejected_logratio
    if loss == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    if loss != "sigmoid":
        raise ValueError(f"unknown DPO loss {loss!r}; use one of {', '.join(LOSSES)}")
    return -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(
        -beta * h
    )


def group_logprobs(model: Backbone, groups: Sequence[EncodedGroup], pad_id: int) -> Tensor:
    """log pi of every distinct response of `groups`, in order [R]."""
    return sequence_logprobs(model, sequence_batch([e for g in groups for e in g.examples], pad_id))


@torch.no_grad()
def all_logprobs(
    model: Backbone, groups: Sequence[EncodedGroup], pad_id: int, chunk: int, bf16: bool = False
) -> list[Tensor]:
    """Per group, log pi of its distinct responses; `chunk` groups per forward.

    `bf16` computes them under the training steps' autocast: the reference log-probs of the
    training pairs must come from the same precision as the policy's, or on CUDA every
    log-ratio starts off zero by the rounding difference and DPO fits that noise.
    """
    out = []
    with autocast(next(model.parameters()).device, bf16):
        for start in range(0, len(groups), chunk):
            part = groups[start : start + chunk]
            flat = group_logprobs(model, part, pad_id).cpu().split([len(g.examples) for g in part])
            out += list(flat)
    return out


def pair_loss(
    model: Backbone,
    groups: Sequence[EncodedGroup],
    reference: Sequence[Tensor],
    pad_id: int,
    cfg: DPOParams,
) -> tuple[Tensor, dict[str, float], int]:
    """Loss over all ranked pairs of `groups`, what it measured, and the tokens forwarded.

    `reference`: per group, the reference's log-probs of its distinct responses."""
    logprobs = group_logprobs(model, groups, pad_id)  # [R]
    ratio = logprobs - torch.cat(list(reference)).to(logprobs.device)
    pairs = ranking_pairs(groups)
    better, worse = pairs.better.to(ratio.device), pairs.worse.to(ratio.device)
    weight = pairs.weight.to(ratio.device)
    losses = dpo_loss(
        ratio[better],
        ratio[worse],
        beta=cfg.beta,
        loss=cfg.loss,
        label_smoothing=cfg.label_smoothing,
    )
    with torch.no_grad():
        margin = cfg.beta * (ratio[better] - ratio[worse])
        stats = {
            "reward_accuracy": float((weight * (margin > 0)).sum()),
            "reward_margin": float((weight * margin).sum()),
            "chosen_logp": float((weight * logprobs[better]).sum()),
            "rejected_logp": float((weight * logprobs[worse]).sum()),
        }
    return (weight * losses).sum(), stats, sum(g.tokens for g in groups)


def mean_pair_loss(
    model: Backbone,
    groups: Sequence[EncodedGroup],
    reference: Sequence[Tensor],
    pad_id: int,
    cfg: DPOParams,
    chunk: int,
) -> dict[str, float]:
    """pair_loss and its measures over a whole set, `chunk` prompts per forward, each prompt
    weighing the same: `val_loss` and the statistics of `pair_loss`."""
    totals: dict[str, float] = {}
    for start in range(0, len(groups), chunk):
        part = slice(start, start + chunk)
        loss, stats, _ = pair_loss(model, groups[part], reference[part], pad_id, cfg)
        share = len(groups[part]) / len(groups)
        for key, value in {"val_loss": loss.item(), **stats}.items():
            totals[key] = totals.get(key, 0.0) + value * share
    return totals


def implicit_rewards(
    groups: Sequence[EncodedGroup],
    logprobs: Sequence[Tensor],
    reference: Sequence[Tensor],
    beta: float,
) -> list[list[float]]:
    """beta * (log pi - log pi_ref) of every ranked response, group by group: the reward DPO
    implies, scored like a reward model's."""
    return [
        [beta * float(logp[i] - ref[i]) for i in g.rows]
        for g, logp, ref in zip(groups, logprobs, reference, strict=True)
    ]
