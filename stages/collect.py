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
from rlhf.labeling import noisy_rankings
from rlhf.params import CollectParams
from rlhf.tasks import gold_score
from rlhf.tokenizer import load_tokenizer
from rlhf.training import resolve_device
from stages import paths
from stages.common import console, params, progress

# An immediate end token decodes to "", which the ranked schema rejects as empty text; this
# stand-in keeps the sample (the judge scores it low, as it should an empty answer).
NO_ANSWER = "(no answer)"


def sample_comparisons(c: CollectParams, seed: int, device_choice: str) -> tuple[list, dict]:
    """Rows of K ranked SFT samples per training prompt, and collection statistics."""
    device = resolve_device(device_choice)
    tokenizer = load_tokenizer(paths.TOKENIZER)
    policy, _ = checkpoint.load_model(paths.SFT_MODEL, tokenizer, device)
    prompts = read_rows(paths.PROMPTS_TRAIN, PROMPT_SCHEMA)
    demos: dict[str, str] = {}
    if c.include_demo:
        for row in read_rows(paths.SFT_TRAIN, SFT_SCHEMA):
            demos.setdefault(row["prompt"], row["response"])

    repeated = [row["prompt"] for row in prompts for _ in range(c.k)]
    config = SamplingConfig(
        max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_p=c.top_p
    )
    started = time.perf_counter()
    with progress() as bar:
        task = bar.add_task("collect", total=len(repeated), extra=f"K={c.k}")
        samples = generate_texts(
            policy,
            tokenizer,
            repeated,
            config,
            batch_size=c.batch_size,
            generator=torch.Generator(device).manual_seed(seed),
            on_batch=lambda n: bar.update(task, advance=n),
        )
    seconds = time.perf_counter() - started

    rows: list[dict[str, Any]] = []
    for index, prompt_row in enumerate(prompts):
        prompt = prompt_row["prompt"]
        responses = [s if s.strip() else NO_ANSWER for s in samples[index * c.k :][: c.k]]
        if prompt in demos:
            responses.append(demos[prompt])
        rows.append(
            {
                "prompt": prompt,
                "responses": responses,
                "task": prompt_row["task"],
                "source": "sft-samples" + ("+demo" if prompt in demos else ""),
                "gold_scores": [gold_score(prompt, r) for r in responses],
            }
        )
    labels = noisy_rankings([r["gold_scores"] for r in rows], c.label_noise, seed)
    for row, ranks in zip(rows, labels.ranks, strict=True):
        row["ranks"] = ranks
    generated_tokens = sum(len(tokenizer.encode(s)) + 1 for s in samples)
    all_gold = [g for r in rows for g in r["gold_scores"]]
    stats = {
        "label_flip_share": labels.flip_share,
        "gold_tie_share": labels.tie_share,
        "label_noise_scale": labels.noise_scale,
        "gold_mean_of_samples": round(sum(all_gold) / len(all_gold), 4),
        "sampling_seconds": round(seconds, 2),
        "sampling_tokens_per_s": round(generated_tokens / seconds),
    }
    return rows, stats


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
    else:
        rows, stats = imported_comparisons(), {}
    train, val = split_by_prompt(rows, c.val_fraction, p.seed)
    write_rows(paths.COMPARISONS_TRAIN, train, COMPARISON_SCHEMA)
    write_rows(paths.COMPARISONS_VAL, val, COMPARISON_SCHEMA)
    pairs = sum(len(r["responses"]) * (len(r["responses"]) - 1) // 2 for r in rows)
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
