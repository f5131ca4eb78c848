"""Next-token cross-entropy with the LM head inside, a chunk of tokens at a time.

The plain loss, `cross_entropy(lm_head(hidden).float(), targets)`, holds float32 logits over
the whole vocabulary for every token of the batch, and their gradient: 3.3 GB each at GPT-2's
50,257 tokens for a batch of 16 x 1,024. Here the head runs on `CHUNK_TOKENS` tokens at a time,
and each chunk's gradients (for the hidden states and the head's weight) are computed as soon
as its loss is (the fused linear cross-entropy of Liger-Kernel and Apple's cut cross-entropy,
in torch ops): the backward pass only scales them, so no chunk's logits outlive it and the head
never runs twice. Each chunk is the plain computation on its tokens, its gradients the very
kernels autograd would run for it (under autocast the head's matmuls run in bfloat16 as
`nn.Linear`'s would): a batch of one chunk gets the plain loss and gradients bit for bit, more
chunks up to the order in which their sums are added.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import _reduction

from rlhf.data.batching import IGNORE_INDEX

CHUNK_TOKENS = 4096  # tokens whose logits one chunk holds: [4096, V] float32 at a time
SUM = _reduction.get_enum("sum")
aten = torch.ops.aten

# (hidden [n, C], weight [V', C], targets [n], scale, grad for hidden?, grad for weight?,
# real vocabulary V) -> (summed loss, scale times its gradient for hidden or None, for weight
# or None)
ChunkTerms = Callable[
    [Tensor, Tensor, Tensor, Tensor, bool, bool, int],
    tuple[Tensor, Tensor | None, Tensor | None],
]


def chunk_terms(
    hidden: Tensor, weight: Tensor, targets: Tensor, scale: Tensor, for_hidden: bool,
    for_weight: bool, vocab: int,
) -> tuple[Tensor, Tensor | None, Tensor | None]:  # fmt: skip
    """One chunk's summed cross-entropy over its targets that are not IGNORE_INDEX, and
    `scale` times that sum's gradients for `hidden` [n, C] and for the head's `weight`
    [V', C], where asked. The gradients are written out as the ATen backward kernels autograd
    runs for the plain loss (so bit for bit its gradients), which leaves a compiled chunk
    without a graph break. Rows of `weight` past `vocab` are padding (`Backbone.head_weight`):
    their logits are -inf, so they take no probability and get a zero gradient."""
    out = F.linear(hidden, weight)  # [n, V']; bfloat16 under autocast
    logits = out.float()
    if weight.shape[0] > vocab:
        logits[:, vocab:] = float("-inf")
    logp = logits.log_softmax(-1)
    loss, total_weight = aten.nll_loss_forward(logp, targets, None, SUM, IGNORE_INDEX)
    if not (for_hidden or for_weight):
        return loss, None, None
    grad = aten.nll_loss_backward(scale, logp, targets, None, SUM, IGNORE_INDEX, total_weight)
    grad_out = aten._log_softmax_backward_data(grad, logp, -1, logp.dtype).to(out.dtype)
    grad_hidden = grad_out.mm(weight.to(out.dtype)).to(hidden.dtype) if for_hidden else None
    grad_weight = grad_out.t().mm(hidden.to(out.dtype)).to(weight.dtype) if for_weight else None
    return loss, grad_hidden, grad_weight


@functools.cache
def compiled_chunk_terms() -> ChunkTerms:
    """`chunk_terms` compiled whole (its shapes marked dynamic as they vary), for the models
    whose blocks are compiled."""
    return torch.compile(chunk_terms, fullgraph=True)


def target_count(targets: Tensor) -> Tensor:
    """The targets the mean is over, as a float: at least 1, so that none (a data-parallel
    rank's stand-in row) gives a loss of 0, not NaN."""
    return (targets != IGNORE_INDEX).sum().clamp(min=1).float()


def chunked(
    hidden: Tensor, weight: Tensor, targets: Tensor, terms: ChunkTerms, for_hidden: bool,
    for_weight: bool, vocab: int,
) -> tuple[Tensor, Tensor | None, Tensor | None]:  # fmt: skip
    """The mean loss over every chunk, and its gradients for `hidden` and `weight` where
    asked (made chunk by chunk, each as soon as its loss is); `weight`'s rows past `vocab`
    are padding."""
    count = target_count(targets)
    scale = 1.0 / count  # each token's share of the mean's gradient, as the plain one
    total = hidden.new_zeros((), dtype=torch.float32)
    grad_hidden = torch.zeros_like(hidden) if for_hidden else None
    grad_weight = torch.zeros_like(weight) if for_weight else None
    for start in range(0, hidden.shape[0], CHUNK_TOKENS):
        chunk = slice(start, start + CHUNK_TOKENS)
        loss, chunk_hidden, chunk_weight = terms(
            hidden[chunk], weight, targets[chunk], scale, for_hidden, for_weight, vocab
        )
        total = total + loss
        if grad_hidden is not None:
            grad_hidden[chunk] = chunk_hidden
        if grad_weight is not None:
            grad_weight += chunk_weight
    return total / count, grad_hidden, grad_weight


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of `hidden @ weight.T` whose gradients are made in the forward."""

    @staticmethod
    def forward(
        ctx, hidden: Tensor, weight: Tensor, targets: Tensor, terms: ChunkTerms, vocab: int
    ) -> Tensor:
        loss, *ctx.grads = chunked(hidden, weight, targets, terms, *ctx.needs_input_grad[:2], vocab)
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        """The forward's gradients scaled in place and handed over: the graph keeps no copy of
        them (a [V, C] float32 head gradient beside the parameter's own until the loss is
        freed, after the optimizer step). One backward per loss, as the training loops run."""
        grad_hidden, grad_weight = ctx.grads
        ctx.grads = None
        return (
            None if grad_hidden is None else grad_hidden.mul_(grad_loss),
            None if grad_weight is None else grad_weight.mul_(grad_loss),
            None,
            None,
            None,
        )


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    terms: ChunkTerms = chunk_terms,
    vocab: int | None = None,
) -> Tensor:
    """Mean next-token cross-entropy of the logits `hidden @ weight.T` (hidden [N, C], the
    head's weight [V', C], of which the first `vocab` rows are real and the rest padding;
    all real by default) against `targets` [N], over the targets that are not IGNORE_INDEX;
    `terms`: `chunk_terms`, or a compiled version of it. Without autograd (validation) no
    gradient is made."""
    vocab = weight.shape[0] if vocab is None else vocab
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(hidden, weight, targets, terms, vocab)
    return chunked(hidden, weight, targets, terms, False, False, vocab)[0]
