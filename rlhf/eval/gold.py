"""Gold-judged scores of a policy's answers, overall and per task family.

Per-family means are reported beside the overall mean so that an easy family cannot carry it.
Only prompts from the synthetic task suite have a gold judge; imported prompts get None.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from rlhf.models.backbone import Backbone
from rlhf.sampling.generate import generate_texts
from rlhf.sampling.sampler import SamplingConfig
from rlhf.synthetic.tasks import gold_score
from rlhf.tokenizer.tokenizer import Tokenizer

Rows = Sequence[dict[str, Any]]


def has_judge(rows: Rows) -> bool:
    """Whether the gold judge can score these prompt rows (all from the synthetic suite)."""
    return all(row["source"] == "synthetic" for row in rows)


def gold_summary(
    prompts: Sequence[str], tasks: Sequence[str], answers: Sequence[str]
) -> dict[str, Any]:
    """{"mean": overall mean gold score, "by_task": {family: mean}, "scores": per answer}."""
    if not prompts:
        raise ValueError("no prompts to score")
    by_task: defaultdict[str, list[float]] = defaultdict(list)
    scores = []
    for prompt, task, answer in zip(prompts, tasks, answers, strict=True):
        score = gold_score(prompt, answer)
        scores.append(score)
        by_task[task].append(score)
    return {
        "mean": round(sum(scores) / len(scores), 4),
        "by_task": {t: round(sum(v) / len(v), 4) for t, v in sorted(by_task.items())},
        "scores": scores,
    }


def gold_eval(
    model: Backbone,
    tokenizer: Tokenizer,
    heldout: Rows,
    *,
    greedy: bool,
    max_new_tokens: int,
    seed: int,
    batch_size: int,
) -> dict[str, Any] | None:
    """One answer per held-out prompt (greedy or sampled), gold-judged; None without a judge."""
    if not has_judge(heldout):
        return None
    config = SamplingConfig(max_new_tokens=max_new_tokens, greedy=greedy)
    generator = torch.Generator(next(model.parameters()).device).manual_seed(seed)
    prompts = [row["prompt"] for row in heldout]
    answers = generate_texts(
        model, tokenizer, prompts, config, batch_size=batch_size, generator=generator
    )
    return gold_summary(prompts, [row["task"] for row in heldout], answers)
