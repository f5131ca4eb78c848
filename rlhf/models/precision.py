"""A bfloat16 copy of a float32 model, to sample from under bfloat16 autocast.

Under autocast every matmul casts its float32 weight to bfloat16 on every call: a rollout of a
hundred decoding steps casts the whole model a hundred times (about 0.74 GB of memory traffic
per step at GPT-2 124M, seen in inductor's code for the compiled step). The copy stores those
weights in bfloat16 once, and computes what autocast computes from the float32 model: autocast
casts a bfloat16 weight to itself, and what it leaves in float32 stays float32 here (the
embeddings, hence the residual stream, the norms, every one-dimensional parameter). A tied LM
head is untied for it: the head's matmul takes the embedding in bfloat16, the lookup keeps it
in float32. `refresh` copies the trained model's weights in, in place, so the decoding graphs
captured over the copy stay valid from one rollout to the next.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from rlhf.models.backbone import Backbone


class SamplingCopy:
    """`model` with its matmul weights (every parameter of two or more dimensions outside an
    embedding, adapters included) in bfloat16, refreshed from `model` by `refresh`."""

    def __init__(self, model: Backbone) -> None:
        # the compiled blocks (training forwards) stay behind: decoding compiles its own step
        self.model: Backbone = copy.deepcopy(model, memo={id(model.compiled_blocks): None})
        head = self.model.lm_head
        every = self.model.named_parameters(remove_duplicate=False)
        if sum(p is head.weight for _, p in every) > 1:  # tied to the embedding: untied here
            head.weight = nn.Parameter(head.weight.detach().clone())
        self.model.requires_grad_(False).eval()
        for module in self.model.modules():
            if isinstance(module, nn.Embedding):
                continue
            for parameter in module.parameters(recurse=False):
                if parameter.dim() >= 2:
                    parameter.data = parameter.data.to(torch.bfloat16)
        copies = dict(self.model.named_parameters())
        # every name a parameter goes by, a tied one's too: each copy has its source
        self.sources = [
            (copies[name], source)
            for name, source in model.named_parameters(remove_duplicate=False)
            if name in copies
        ]

    @torch.no_grad()
    def refresh(self) -> Backbone:
        """The copy, holding `model`'s weights as they are now."""
        for target, source in self.sources:
            target.copy_(source)
        return self.model


def wants_sampling_copy(model: Backbone, device: torch.device, bf16: bool) -> bool:
    """Whether sampling `model` should go through a `SamplingCopy`: a float32 model sampled
    under bfloat16 autocast on CUDA (elsewhere there is no autocast to save)."""
    dtype = next(model.parameters()).dtype
    return bf16 and device.type == "cuda" and dtype == torch.float32
