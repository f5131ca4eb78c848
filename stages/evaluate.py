"""evaluate: every policy on the held-out prompts, the paper's win-rate table, and the report.

Each policy present (SFT, PPO, later DPO) answers the held-out prompts greedily and by
sampling; every answer gets its gold score, reward-model score, KL to SFT, length and whether
it ended. All policies sample with the same seed, so their i-th answers share random numbers
and the paired win rates compare policies rather than luck. PPO's snapshots along training
give the over-optimization curve: proxy and gold score against KL to SFT.

Writes metrics/eval.json (stable keys for `dvc metrics diff`), the curve as CSV for `dvc
plots`, and reports/ (eval.md and its figures) in one atomic step. `run()` returns the
headline numbers as a flat dict for the Prefect flow to publish.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlhf import checkpoint, plots, report
from rlhf.atomic import atomic_path, write_csv, write_json
from rlhf.data import PROMPT_SCHEMA, read_rows
from rlhf.generation import SamplingConfig
from rlhf.model import GPT
from rlhf.policy_eval import ScoredAnswers, score_policy
from rlhf.rewards import RewardModelScorer
from rlhf.tasks import gold_score
from rlhf.tokenizer import load_tokenizer
from rlhf.training import resolve_device
from rlhf.win_rates import WinRate, compare
from stages import paths
from stages.common import console, params, progress

# metric key -> (which answers, which of their measures)
MEASURES = {
    "gold_sampled": ("sampled", "gold"),
    "gold_greedy": ("greedy", "gold"),
    "rm_sampled": ("sampled", "reward"),
    "kl_to_sft": ("sampled", "kl"),
    "response_length": ("sampled", "length"),
    "end_token_rate": ("sampled", "end_token_rate"),
}
HEADLINE = (
    "gold_sampled", "gold_greedy", "rm_sampled", "kl_to_sft", "response_length",
    "end_token_rate", "win_rate", "win_rate_greedy",
)  # fmt: skip


def win_rates(answers: dict[str, ScoredAnswers], resamples: int, seed: int) -> dict[str, WinRate]:
    """Gold-judged win rate of every later policy over every earlier one (`ppo_vs_sft`)."""
    names = list(answers)
    rates = {}
    for i, baseline in enumerate(names):
        for name in names[i + 1 :]:
            a, b = answers[name], answers[baseline]
            assert a.gold is not None and b.gold is not None
            rates[f"{name}_vs_{baseline}"] = compare(
                a.gold, b.gold, a.prompt_index, resamples=resamples, seed=seed
            )
    return rates


def summarize(
    answers: dict[str, dict[str, ScoredAnswers]],
    rates: dict[str, WinRate],
    greedy_rates: dict[str, WinRate],
) -> dict[str, Any]:
    """The metrics dict: `<measure>.<policy>`, `win_rate.<a>_vs_<b>` and `by_task`.

    `answers`: {"sampled" | "greedy": {policy: its answers}}.
    """
    policies = list(answers["sampled"])
    has_gold = answers["sampled"]["sft"].gold is not None
    measures = {k: v for k, v in MEASURES.items() if has_gold or not k.startswith("gold")}
    means = {kind: {n: a.means() for n, a in by_name.items()} for kind, by_name in answers.items()}
    by_task = {
        kind: {n: a.by_task() for n, a in by_name.items()} for kind, by_name in answers.items()
    }
    metrics: dict[str, Any] = {
        key: {n: means[kind][n][measure] for n in policies}
        for key, (kind, measure) in measures.items()
    }
    metrics["by_task"] = {
        n: {
            task: {key: by_task[kind][n][task][m] for key, (kind, m) in measures.items()}
            for task in by_task["sampled"][n]
        }
        for n in policies
    }
    if rates:
        metrics["win_rate"] = {k: round(r.rate, 4) for k, r in rates.items()}
        metrics["win_rate_ci95"] = {
            k: {"low": round(r.low, 4), "high": round(r.high, 4)} for k, r in rates.items()
        }
        metrics["win_rate_greedy"] = {k: round(r.rate, 4) for k, r in greedy_rates.items()}
    return metrics


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def side_by_side(
    prompts: list[str],
    tasks: list[str],
    answers: dict[str, dict[str, ScoredAnswers]],
    per_task: int,
) -> list[dict[str, Any]]:
    """The first `per_task` prompts of each family with every policy's answers to them."""
    chosen: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        if len(chosen.setdefault(task, [])) < per_task:
            chosen[task].append(i)
    examples = []
    for task, rows in chosen.items():
        for i in rows:
            shown = {}
            for name, s in answers["sampled"].items():
                g = answers["greedy"][name]
                first = s.prompt_index.index(i)
                shown[name] = {
                    "greedy": g.responses[i],
                    "greedy_gold": g.gold[i] if g.gold else None,
                    "sampled": s.responses[first],
                    "sampled_gold": s.gold[first] if s.gold else None,
                    "sampled_rm": round(s.reward[first], 2),
                }
            examples.append({"task": task, "prompt": prompts[i], "answers": shown})
    return examples


def curve_point(step: int, answers: ScoredAnswers) -> dict[str, Any]:
    means = answers.means()
    return {
        "step": step,
        "kl_to_sft": means["kl"],
        "rm_score": means["reward"],
        "gold_score": means["gold"],
    }


def write_report(
    staged: Path,
    metrics: dict[str, Any],
    rates: dict[str, WinRate],
    curve: list[dict[str, Any]],
    examples: list[dict[str, Any]],
) -> None:
    """reports/: eval.md and the figures the data allows, into the staged directory."""
    (staged / "figures").mkdir(parents=True)
    figures: dict[str, str] = {}  # caption -> path relative to the report

    def figure(caption: str, name: str, draw: Callable[[Path], None]) -> None:
        figures[caption] = f"figures/{name}.png"
        draw(staged / figures[caption])

    if rates:
        figure("Win rates", "win_rates", lambda path: plots.win_rates(path, rates))
    if "gold_sampled" in metrics:
        by_policy = {
            p: {"all": gold} | {t: v["gold_sampled"] for t, v in metrics["by_task"][p].items()}
            for p, gold in metrics["gold_sampled"].items()
        }
        caption = "Gold score by task family, sampled answers"
        figure(
            caption,
            "gold_by_task",
            lambda path: plots.scores_by_task(path, by_policy, caption, "mean gold score (0-1)"),
        )
    if len(curve) > 1:
        figure(
            "Over-optimization: reward-model and gold score against KL to SFT",
            "overoptimization",
            lambda path: plots.overoptimization_curve(path, curve),
        )
    training = {
        "sft_steps": read_csv(paths.SFT_STEPS),
        "sft_epochs": read_csv(paths.SFT_EPOCHS),
        "rm_steps": read_csv(paths.RM_STEPS),
        "rm_epochs": read_csv(paths.RM_EPOCHS),
        "ppo_steps": read_csv(paths.PPO_STEPS),
    }
    figure("Training curves", "training", lambda path: plots.training_curves(path, **training))
    text = report.render(metrics, curve=curve, examples=examples, figures=figures)
    (staged / paths.REPORT.name).write_text(text)


def headline(metrics: dict[str, Any]) -> dict[str, float]:
    """`<measure>.<policy>` and `win_rate.<pair>` as one flat dict, as `dvc metrics show`
    names them."""
    return {
        f"{key}.{name}": value for key in HEADLINE for name, value in metrics.get(key, {}).items()
    }


def run() -> dict[str, float]:
    p = params()
    cfg = p.evaluate
    torch.manual_seed(p.seed)
    device = resolve_device(p.device)
    tokenizer = load_tokenizer(paths.TOKENIZER)
    heldout = read_rows(paths.PROMPTS_HELDOUT, PROMPT_SCHEMA)
    prompts = [r["prompt"] for r in heldout]
    tasks = [r["task"] for r in heldout]
    synthetic = all(r["source"] == "synthetic" for r in heldout)
    sft, _ = checkpoint.load_model(paths.SFT_MODEL, tokenizer, device)
    policies: dict[str, GPT] = {"sft": sft}
    rl_policy, rl_steps = None, 0  # the RL stage's policy, named by its algorithm
    for name, path in paths.POLICIES.items():
        if name != "sft" and path.exists():
            model, payload = checkpoint.load_model(path, tokenizer, device)
            if path == paths.PPO_MODEL:
                name, rl_policy, rl_steps = payload["algo"], payload["algo"], payload["step"]
            policies[name] = model
    snapshots = sorted(paths.PPO_SNAPSHOTS.glob("step_*.pt")) if rl_policy else []

    evaluate = functools.partial(
        score_policy,
        tokenizer=tokenizer,
        prompts=prompts,
        tasks=tasks,
        reference=sft,
        scorer=RewardModelScorer.load(paths.RM_MODEL, tokenizer, device),
        judge=gold_score if synthetic else None,
        seed=p.seed,
        batch_size=cfg.batch_size,
    )
    sampling = SamplingConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    greedy_decoding = SamplingConfig(max_new_tokens=cfg.max_new_tokens, greedy=True)
    answers: dict[str, dict[str, ScoredAnswers]] = {"sampled": {}, "greedy": {}}
    sampled = answers["sampled"]
    curve: list[dict[str, Any]] = []
    with progress() as bar:
        task = bar.add_task("evaluate", total=2 * len(policies) + len(snapshots), extra="")
        for name, model in policies.items():
            bar.update(task, extra=name)
            sampled[name] = evaluate(model, n=cfg.samples, config=sampling)
            answers["greedy"][name] = evaluate(model, n=1, config=greedy_decoding)
            bar.advance(task, 2)
        if rl_policy:
            curve.append(curve_point(0, sampled["sft"]))
            for snapshot in snapshots:
                bar.update(task, extra=snapshot.stem)
                model, payload = checkpoint.load_model(snapshot, tokenizer, device)
                along = evaluate(model, n=cfg.samples, config=sampling)
                curve.append(curve_point(int(payload["step"]), along))
                bar.advance(task)
            curve.append(curve_point(rl_steps, sampled[rl_policy]))

    rates = greedy_rates = {}
    if synthetic:
        rates = win_rates(sampled, cfg.bootstrap_resamples, p.seed)
        greedy_rates = win_rates(answers["greedy"], cfg.bootstrap_resamples, p.seed)
    metrics = {
        "prompts": len(prompts),
        "samples_per_prompt": cfg.samples,
        "temperature": cfg.temperature,
        **summarize(answers, rates, greedy_rates),
    }
    examples = side_by_side(prompts, tasks, answers, cfg.examples_per_task)
    with atomic_path(paths.REPORTS) as staged:
        write_report(staged, metrics, rates, curve, examples)
    write_csv(paths.EVAL_CURVE, curve)
    write_json(paths.EVAL_METRICS, metrics)
    numbers = headline(metrics)
    shown = [f"{k} {v}" for k, v in numbers.items() if k.startswith(("gold_sampled.", "win_rate."))]
    console.print(f"evaluate: {', '.join(shown)}; report in {paths.REPORT}")
    return numbers


if __name__ == "__main__":
    run()
