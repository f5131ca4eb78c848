"""The evaluation's numbers: every policy's measures, the pairwise win rates, the answers shown
side by side, and the over-optimization points, as the metrics dict `dvc metrics` compares.

Metric keys are a contract: `<measure>.<policy>`, `win_rate.<judge>.<a>_vs_<b>` (ties half)
with `win_rate_ci95`, `win_rate_decisive` with `win_rate_decisive_ci95`, `tie_rate` and
`win_rate_greedy` under the same `<judge>.<a>_vs_<b>`, and `by_task.<policy>.<task>.<measure>`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlhf.eval.answers import ScoredAnswers
from rlhf.eval.metric_keys import flattened
from rlhf.eval.win_rates import WinRate, compare_outcomes, outcomes

if TYPE_CHECKING:
    from rlhf.algorithms.scorers import PairJudge

# metric key -> (which answers, which of their measures)
MEASURES = {
    "gold_sampled": ("sampled", "gold"),
    "gold_greedy": ("greedy", "gold"),
    "rm_sampled": ("sampled", "reward"),
    "gold_best_temperature": ("best_temperature", "gold"),
    "kl_to_sft": ("sampled", "kl"),
    "kl_to_sft_sampled": ("sampled", "kl_sampled"),
    "response_length": ("sampled", "length"),
    "end_token_rate": ("sampled", "end_token_rate"),
}
HEADLINE = (
    "gold_sampled", "gold_greedy", "gold_best_temperature", "rm_sampled", "kl_to_sft",
    "response_length", "end_token_rate", "win_rate", "win_rate_decisive", "tie_rate",
    "win_rate_greedy", "best_temperature", "win_rate_best_temperature", "win_rate_vs_best_of_n",
    "accuracy", "accuracy_greedy", "pass_at_k",
)  # fmt: skip


def win_rates(
    answers: Mapping[str, ScoredAnswers],
    judges: Sequence[str],
    resamples: int,
    seed: int,
    pairwise: Mapping[str, PairJudge] | None = None,
) -> dict[str, dict[str, WinRate]]:
    """By judge, the win rate of every later policy over every earlier one (`ppo_vs_sft`):
    from each answer's score by the judge, or for a judge in `pairwise`, from its verdict on
    the two answers."""
    names = list(answers)
    rates: dict[str, dict[str, WinRate]] = {}
    for judge in judges:
        rates[judge] = {}
        for i, baseline in enumerate(names):
            for name in names[i + 1 :]:
                a, b = answers[name], answers[baseline]
                if pairwise and judge in pairwise:
                    wins = pairwise[judge](a.prompts, a.responses, b.responses).tolist()
                else:
                    wins = outcomes(a.judged_by(judge), b.judged_by(judge))
                rates[judge][f"{name}_vs_{baseline}"] = compare_outcomes(
                    wins, a.prompt_index, resamples=resamples, seed=seed
                )
    return rates


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


# metrics key -> its value from one WinRate
RATE_FIELDS = {
    "win_rate": lambda r: round(r.rate, 4),
    "win_rate_ci95": lambda r: {"low": round(r.low, 4), "high": round(r.high, 4)},
    "win_rate_decisive": lambda r: _rounded(r.decisive),
    "win_rate_decisive_ci95": lambda r: {
        "low": _rounded(r.decisive_low),
        "high": _rounded(r.decisive_high),
    },
    "tie_rate": lambda r: round(r.tie_rate, 4),
}


def summarize(
    answers: Mapping[str, Mapping[str, ScoredAnswers]],
    rates: Mapping[str, Mapping[str, WinRate]],
    greedy_rates: Mapping[str, Mapping[str, WinRate]],
) -> dict[str, Any]:
    """The metrics dict. `answers`: {"sampled" | "greedy" | "best_temperature": {policy: its
    answers}} (a kind left out leaves out its measures); `rates` and `greedy_rates`: {judge:
    {pair: its win rate}}."""
    policies = list(answers["sampled"])
    has_gold = answers["sampled"]["sft"].gold is not None
    measures = {
        k: (kind, m)
        for k, (kind, m) in MEASURES.items()
        if kind in answers and (has_gold or not k.startswith("gold"))
    }
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
        metrics |= {
            key: {
                judge: {pair: value(r) for pair, r in by_pair.items()}
                for judge, by_pair in rates.items()
            }
            for key, value in RATE_FIELDS.items()
        }
        for key, value in (
            ("win_rate_greedy", "win_rate"),
            ("win_rate_greedy_ci95", "win_rate_ci95"),
        ):
            metrics[key] = {
                judge: {pair: RATE_FIELDS[value](r) for pair, r in by_pair.items()}
                for judge, by_pair in greedy_rates.items()
            }
    return metrics


def headline(metrics: Mapping[str, Any]) -> dict[str, float]:
    """`<measure>.<policy>` and `win_rate.<judge>.<pair>` as one flat dict."""
    return {
        k: v for key in HEADLINE if key in metrics for k, v in flattened(key, metrics[key]).items()
    }


def side_by_side(
    prompts: Sequence[str],
    tasks: Sequence[str],
    answers: Mapping[str, Mapping[str, ScoredAnswers]],
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
    """One point of the over-optimization curve: KL to SFT, RM score and gold score."""
    means = answers.means()
    return {
        "step": step,
        "kl_to_sft": means["kl"],
        "rm_score": means["reward"],
        "gold_score": means["gold"],
    }
