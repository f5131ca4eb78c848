"""Comparison data as InstructGPT gathered it: K sampled answers per prompt, ranked.

For each training prompt, K responses are sampled from the SFT policy and ranked by a labeler:
simulated people (the gold judge plus noise, `labelers.py`) on the task suite, or a reward
model (AI feedback) on any prompts, its scores ranked as they are, equal scores tied (people
in the terminal rank the same `candidates`: `rlhf.labeling`). Training
prompts also get answers sampled for sibling prompts of the same task and answers sampled at a
high temperature: the near-misses and the degenerate answers a policy under optimization
finds, which a reward model must have seen to score low.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from itertools import combinations
from typing import Any

import torch

from rlhf.data.importers import ranks_of
from rlhf.data.splits import split_comparisons
from rlhf.models.backbone import Backbone
from rlhf.params.groups import CollectParams
from rlhf.sampling.generate import generate_texts
from rlhf.sampling.sampler import SamplingConfig
from rlhf.synthetic.labelers import disagreement, rank_with_noise
from rlhf.synthetic.tasks import gold_score
from rlhf.tokenizer.tokenizer import Tokenizer

Rows = list[dict[str, Any]]


# the labeler's score of each (prompt, answer), in one batched call
BatchScore = Callable[[Sequence[str], Sequence[str]], list[float]]


def gold_scores(prompts: Sequence[str], answers: Sequence[str]) -> list[float]:
    """The gold judge as a `BatchScore`."""
    return [gold_score(p, a) for p, a in zip(prompts, answers, strict=True)]


def sample_rows(
    policy: Backbone,
    tokenizer: Tokenizer,
    prompt_rows: Sequence[dict[str, Any]],
    demos: dict[str, str],
    c: CollectParams,
    seed: int,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[Rows, int]:
    """Rows of K samples per prompt (plus the prompt's demonstration where `demos` has one),
    and the tokens generated.

    Each row also carries `explore`: `c.explore` answers sampled at `c.explore_temperature`,
    which `comparisons_from_samples` adds to training rows only.
    """
    generator = torch.Generator(next(policy.parameters()).device).manual_seed(seed)

    def sample(n: int, temperature: float) -> list[str]:
        return generate_texts(
            policy,
            tokenizer,
            [row["prompt"] for row in prompt_rows for _ in range(n)],
            SamplingConfig(max_new_tokens=c.max_new_tokens, temperature=temperature, top_p=c.top_p),
            batch_size=c.batch_size,
            generator=generator,
            on_batch=on_batch,
        )

    samples = sample(c.k, c.temperature)
    explored = sample(c.explore, c.explore_temperature) if c.explore else []
    rows: Rows = []
    for index, prompt_row in enumerate(prompt_rows):
        prompt = prompt_row["prompt"]
        responses = samples[index * c.k :][: c.k] + ([demos[prompt]] if prompt in demos else [])
        rows.append(
            {
                "prompt": prompt,
                "responses": responses,
                "task": prompt_row["task"],
                "source": "sft-samples" + ("+demo" if prompt in demos else ""),
                "explore": explored[index * c.explore :][: c.explore],
            }
        )
    generated = sum(len(tokenizer.encode(s)) + 1 for s in samples + explored)
    return rows, generated


def scored(rows: Rows, score: BatchScore) -> None:
    """Give every response of `rows` not yet scored its score, in one batched call."""
    pending = [
        (row, answer) for row in rows for answer in row["responses"][len(row.get("scores", [])) :]
    ]
    values = iter(score([row["prompt"] for row, _ in pending], [a for _, a in pending]))
    for row, _ in pending:
        row.setdefault("scores", []).append(next(values))


def with_answers(row: dict[str, Any], answers: list[str], source: str) -> dict[str, Any]:
    """The row with extra candidate answers, to be scored by the labeler."""
    if not answers:
        return row
    return {
        **row,
        "responses": row["responses"] + answers,
        "scores": list(row.get("scores", [])),
        "source": f"{row['source']}+{source}",
    }


def with_mismatched(rows: Rows, n: int, seed: int) -> Rows:
    """Each row plus `n` answers sampled for other prompts of its task.

    Answers to a sibling prompt look exactly like good answers and differ only in fitting the
    prompt, so ranking them teaches the reward model to read the prompt. A sibling's answer that
    happens to fit (a refusal is a refusal) is scored as such: these are candidates, not
    negatives by decree.
    """
    if n == 0:
        return rows
    rng = random.Random(seed)
    by_task: dict[str, Rows] = {}
    for row in rows:
        by_task.setdefault(row["task"], []).append(row)
    out = []
    for row in rows:
        siblings = [r for r in by_task[row["task"]] if r["prompt"] != row["prompt"]]
        extra = (
            [rng.choice(rng.choice(siblings)["responses"]) for _ in range(n)] if siblings else []
        )
        out.append(with_answers(row, extra, "mismatched"))
    return out


def label(rows: Rows, sampled: list[int], c: CollectParams, seed: int) -> dict[str, float]:
    """Rank every row by its gold scores with one labeler noise level, calibrated on the
    sampled answers alone (`sampled[i]`: how many of row i's responses were sampled for its
    own prompt).

    Noise is a property of the labelers: mismatched answers are easy calls and would otherwise
    inflate the noise needed to reach `label_noise` over all pairs.
    """
    for row in rows:
        row["gold_scores"] = row.pop("scores")
    own = [r["gold_scores"][:n] for r, n in zip(rows, sampled, strict=True)]
    labels = rank_with_noise([r["gold_scores"] for r in rows], c.label_noise, seed, sampled)
    for row, ranks in zip(rows, labels.ranks, strict=True):
        row["ranks"] = ranks
    flips, ties = disagreement(own, [r["ranks"][:n] for r, n in zip(rows, sampled, strict=True)])
    return {
        "label_flip_share": flips,
        "label_flip_share_with_mismatched": labels.flip_share,
        "gold_tie_share": ties,
        "label_noise_scale": labels.noise_scale,
    }


def label_by_score(rows: Rows) -> dict[str, float]:
    """Rank every row by its scores as they are (a reward model's: AI feedback), equal scores
    tied; no gold scores."""
    tied = total = 0
    for row in rows:
        scores = row.pop("scores")
        row["ranks"], row["gold_scores"] = ranks_of(scores), []
        pairs = list(combinations(scores, 2))
        tied, total = tied + sum(a == b for a, b in pairs), total + len(pairs)
    return {"labeler_tie_share": round(tied / max(total, 1), 4)}


def candidates(rows: Rows, c: CollectParams, seed: int) -> tuple[Rows, Rows, list[int]]:
    """Split sampled rows by prompt and add mismatched and explored answers to the training
    side. Returns (train, held-out, how many of each row's answers were sampled for it)."""
    train, val = split_comparisons(rows, c.val_fraction, seed)
    sampled = [len(r["responses"]) for r in train + val]
    train = with_mismatched(train, c.mismatched, seed)
    train = [with_answers(r, r["explore"], "explore") for r in train]
    for row in train + val:
        del row["explore"]
    return train, val, sampled


def comparisons_from_samples(
    rows: Rows, c: CollectParams, seed: int, score: BatchScore = gold_scores
) -> tuple[Rows, Rows, dict[str, float]]:
    """The `candidates` of scored rows, the added answers scored with the labeler's `score`,
    both sides ranked: by the gold scores plus labeler noise when `score` is the gold judge,
    else by the scores as they are. Returns (train, held-out, labeling statistics)."""
    train, val, sampled = candidates(rows, c, seed)
    scored(train, score)
    if score is gold_scores:
        return train, val, label(train + val, sampled, c, seed)
    stats = label_by_score(train + val)
    ranked = [[r for r in rows if len(set(r["ranks"])) > 1] for rows in (train, val)]
    # a labeler that scores every answer to a prompt alike (an answer checker where all are
    # right, or all wrong) states no preference there: the prompt gives no comparison
    stats["prompts_all_tied"] = len(train) + len(val) - sum(map(len, ranked))
    return ranked[0], ranked[1], stats
