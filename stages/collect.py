"""collect: comparison data for the reward model, as InstructGPT gathered it.

For each training prompt, K responses are sampled from the SFT policy (batched, KV cache) and
ranked by simulated labelers: the gold judge plus calibrated noise (`rlhf.labeling`). With
`collect.source: files`, imported comparisons take the place of sampling. Either way the
comparisons are split by prompt into train and held-out sets, so the reward model is scored on
prompts it never saw.
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch

from rlhf import checkpoint
from rlhf.atomic import write_json
from rlhf.data import (
    COMPARISON_SCHEMA,
    PROMPT_SCHEMA,
    RANKED_SCHEMA,
    SFT_SCHEMA,
    read_rows,
    write_rows,
)
from rlhf.generation import SamplingConfig, generate_texts
from rlhf.labeling import disagreement, noise_scale, rank_with_noise
from rlhf.params import CollectParams
from rlhf.tasks import gold_score
from rlhf.tokenizer import load_tokenizer
from rlhf.training import resolve_device
from stages import paths
from stages.common import console, params, progress


def sample_comparisons(c: CollectParams, seed: int, device_choice: str) -> tuple[list, dict]:
    """Rows of K gold-scored SFT samples per training prompt, and sampling statistics.

    Each row also carries `explore`: `c.explore` answers sampled at `c.explore_temperature`,
    which `run` adds to training rows only.
    """
    device = resolve_device(device_choice)
    tokenizer = load_tokenizer(paths.TOKENIZER)
    policy, _ = checkpoint.load_model(paths.SFT_MODEL, tokenizer, device)
    prompts = read_rows(paths.PROMPTS_TRAIN, PROMPT_SCHEMA)
    demos: dict[str, str] = {}
    if c.include_demo:
        for row in read_rows(paths.SFT_TRAIN, SFT_SCHEMA):
            demos.setdefault(row["prompt"], row["response"])
    generator = torch.Generator(device).manual_seed(seed)
    per_prompt = c.k + c.explore
    started = time.perf_counter()
    with progress() as bar:
        task = bar.add_task("collect", total=len(prompts) * per_prompt, extra=f"K={c.k}")

        def sample(n: int, temperature: float) -> list[str]:
            return generate_texts(
                policy,
                tokenizer,
                [row["prompt"] for row in prompts for _ in range(n)],
                SamplingConfig(
                    max_new_tokens=c.max_new_tokens, temperature=temperature, top_p=c.top_p
                ),
                batch_size=c.batch_size,
                generator=generator,
                on_batch=lambda done: bar.update(task, advance=done),
            )

        samples = sample(c.k, c.temperature)
        explored = sample(c.explore, c.explore_temperature) if c.explore else []
    seconds = time.perf_counter() - started

    rows: list[dict[str, Any]] = []
    for index, prompt_row in enumerate(prompts):
        prompt = prompt_row["prompt"]
        responses = samples[index * c.k :][: c.k] + ([demos[prompt]] if prompt in demos else [])
        rows.append(
            {
                "prompt": prompt,
                "responses": responses,
                "task": prompt_row["task"],
                "source": "sft-samples" + ("+demo" if prompt in demos else ""),
                "gold_scores": [gold_score(prompt, r) for r in responses],
                "explore": explored[index * c.explore :][: c.explore],
            }
        )
    generated_tokens = sum(len(tokenizer.encode(s)) + 1 for s in samples + explored)
    all_gold = [g for r in rows for g in r["gold_scores"]]
    stats = {
        "gold_mean_of_samples": round(sum(all_gold) / len(all_gold), 4),
        "sampling_seconds": round(seconds, 2),
        "sampling_tokens_per_s": round(generated_tokens / seconds),
    }
    return rows, stats


def with_answers(row: dict[str, Any], answers: list[str], source: str) -> dict[str, Any]:
    """The row with extra candidate answers, each scored by the judge."""
    if not answers:
        return row
    return {
        **row,
        "responses": row["responses"] + answers,
        "gold_scores": row["gold_scores"] + [gold_score(row["prompt"], x) for x in answers],
        "source": f"{row['source']}+{source}",
    }


def with_mismatched(rows: list[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    """Each row plus `n` answers sampled for other prompts of its task, scored by the judge.

    Answers to a sibling prompt look exactly like good answers and differ only in fitting the
    prompt, so ranking them teaches the reward model to read the prompt. A sibling's answer that
    happens to fit (a refusal is a refusal) is scored as such: these are candidates, not
    negatives by decree.
    """
    if n == 0:
        return rows
    rng = random.Random(seed)
    by_task: dict[str, list[dict[str, Any]]] = {}
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


def label(
    rows: list[dict[str, Any]], sampled: list[int], c: CollectParams, seed: int
) -> dict[str, float]:
    """Rank every row with one labeler noise level, calibrated on the sampled answers alone
    (`sampled[i]`: how many of row i's responses were sampled for its own prompt).

    Noise is a property of the labelers: mismatched answers are easy calls and would otherwise
    inflate the noise needed to reach `label_noise` over all pairs.
    """
    own = [r["gold_scores"][:n] for r, n in zip(rows, sampled, strict=True)]
    scale = noise_scale(own, c.label_noise, seed)
    labels = rank_with_noise([r["gold_scores"] for r in rows], scale, seed)
    for row, ranks in zip(rows, labels.ranks, strict=True):
        row["ranks"] = ranks
    flips, ties = disagreement(own, [r["ranks"][:n] for r, n in zip(rows, sampled, strict=True)])
    return {
        "label_flip_share": flips,
        "label_flip_share_with_mismatched": labels.flip_share,
        "gold_tie_share": ties,
        "label_noise_scale": labels.noise_scale,
    }


def imported_comparisons() -> list[dict[str, Any]]:
    if not paths.RAW_COMPARISONS.exists():
        raise FileNotFoundError(
            f"collect.source is 'files' but {paths.RAW_COMPARISONS} does not exist; create it "
            "with `rlhf import FILE --kind pairwise|hh|ranked` and `dvc add` it"
        )
    return [{**row, "gold_scores": []} for row in read_rows(paths.RAW_COMPARISONS, RANKED_SCHEMA)]


def split_by_prompt(
    rows: list[dict[str, Any]], val_fraction: float, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Hold out `val_fraction` of each task's distinct prompts with all their rows.

    Per task, because tasks differ in how many distinct prompts they have (addition has dozens
    of times more than capitals): a split over all prompts would fill the held-out set with
    the largest task and let it decide the reward model's accuracy.
    """
    rng = random.Random(seed)
    held: set[str] = set()
    for task in sorted({r["task"] for r in rows}):
        prompts = sorted({r["prompt"] for r in rows if r["task"] == task})
        rng.shuffle(prompts)
        held.update(prompts[: max(1, round(val_fraction * len(prompts)))])
    return [r for r in rows if r["prompt"] not in held], [r for r in rows if r["prompt"] in held]


def run() -> dict[str, Any]:
    p = params()
    c = p.collect
    if c.source == "policy":
        rows, stats = sample_comparisons(c, p.seed, p.device)
        train, val = split_by_prompt(rows, c.val_fraction, p.seed)
        sampled = [len(r["responses"]) for r in train + val]
        train = with_mismatched(train, c.mismatched, p.seed)
        train = [with_answers(r, r["explore"], "explore") for r in train]
        for row in train + val:
            del row["explore"]
        stats |= label(train + val, sampled, c, p.seed)
    else:
        rows, stats = imported_comparisons(), {}
        train, val = split_by_prompt(rows, c.val_fraction, p.seed)
    write_rows(paths.COMPARISONS_TRAIN, train, COMPARISON_SCHEMA)
    write_rows(paths.COMPARISONS_VAL, val, COMPARISON_SCHEMA)
    pairs = sum(len(r["responses"]) * (len(r["responses"]) - 1) // 2 for r in train + val)
    metrics = {
        "prompts": len(rows),
        "prompts_train": len(train),
        "prompts_val": len(val),
        "pairs": pairs,
        **stats,
    }
    write_json(paths.COLLECT_METRICS, metrics)
    console.print(f"collect ({c.source}): {metrics}")
    return metrics


if __name__ == "__main__":
    run()
