"""Direct preference optimization (Rafailov et al. 2023), its IPO and conservative variants.

DPO needs no reward model and no sampling: the policy's log-ratio to a frozen reference,
log pi(y|x) - log pi_ref(y|x) summed over the response tokens, acts as an implicit reward
(times beta), and the loss is the reward model's pairwise loss on that implicit reward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rlhf.model import GPT
from rlhf.reward import RewardBatch

LOSSES = ("sigmoid", "ipo")


def sequence_logprobs(model: GPT, batch: RewardBatch) -> Tensor:
    """log pi(response | prompt) per row [B]: the response tokens' log-probs, end token included.

    Rows are right-padded, so a causal model's outputs at real positions ignore the padding.
    """
    ids = batch.ids.to(next(model.parameters()).device)
    logits = model(ids[:, :-1]).float()  # [B, T-1, V]: position t predicts token t + 1
    token_logprobs = F.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    position = torch.arange(1, ids.shape[1], device=ids.device)  # index of each predicted token
    start, length = batch.response_start.to(ids.device), batch.lengths.to(ids.device)
    in_response = (position >= start[:, None]) & (position < length[:, None])  # [B, T-1]
    return (token_logprobs * in_response).sum(-1)


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
