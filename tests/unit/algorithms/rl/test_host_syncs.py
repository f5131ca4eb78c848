"""The RL update waits on the device only where it must: counted on the CPU by wrapping what
makes a GPU's host wait (`.tolist()`, `.item()` and the scalar reads behind `int()` and
`float()`, `nonzero` and boolean indexing, whose output size the host must learn)."""

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlhf.algorithms.rl.registry import ALGORITHMS
from rlhf.algorithms.rl.trainer import RLTrainer
from rlhf.algorithms.rules import contains_number
from rlhf.algorithms.scorers import RuleScorer
from rlhf.params.groups import RLParams
from rlhf.tokenizer.tokenizer import save_tokenizer

from conftest import tiny_gpt

PROMPTS = [f"What is {a} plus {a + 2}?" for a in range(8)]


def boolean_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


class HostWaits(TorchDispatchMode):
    """Counts, by kind, the operations that would make the host wait on a GPU."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        tolist = torch.Tensor.tolist

        def counted_tolist(tensor):
            self.counts["tolist"] += 1
            return tolist(tensor)

        monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if name.startswith("_local_scalar_dense"):
            self.counts["item"] += 1
        elif name.startswith(("nonzero", "masked_select")):
            self.counts["nonzero"] += 1
        elif name.startswith(("index.", "index_put")) and boolean_index(args):
            self.counts["boolean index"] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("tok"), "bytes")


def test_a_ppo_minibatch_waits_twice_on_the_device(tokenizer, monkeypatch):
    """8 answers in 4 minibatches of 2 rows, 2 passes, microbatches of one row each: one wait
    per optimizer step (policy and critic: the loss and gradient norm checked together), two
    per pass (its statistics, and its order, drawn on the host), two per update (the
    rollout's lengths and counted tokens); no packing, no forward waits (each used to wait 6
    times: 16 waits per minibatch in all). The scoring pass of a rollout waits once, for its
    lengths, whatever its microbatches."""
    entry = ALGORITHMS["ppo"]
    cfg = entry.params(batch_size=8, minibatch_size=2, update_epochs=2, target_approx_kl=0.0)
    trainer = RLTrainer(
        entry, cfg, RLParams(max_new_tokens=8, microbatch_tokens=1),
        policy=tiny_gpt(tokenizer, 0), reference=tiny_gpt(tokenizer, 1),
        critic=tiny_gpt(tokenizer, 2), scorer=RuleScorer(contains_number),
        tokenizer=tokenizer, prompts=PROMPTS, seed=0,
    )  # fmt: skip
    experience, _ = trainer.experience.make(PROMPTS, trainer.kl_ctl.beta)
    with HostWaits(monkeypatch) as waits:
        trainer.experience._score(experience.rollout)
    assert waits.counts == {"tolist": 1}
    with HostWaits(monkeypatch) as waits:
        stats = trainer.update(experience)
    passes = 2
    assert stats["update_epochs_run"] == passes
    assert waits.counts == {"tolist": 2 * 4 * passes + 2 * passes + 2}
