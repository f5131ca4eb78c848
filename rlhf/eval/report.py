"""The evaluation report as Markdown: the paper's table in miniature, and the warning signs.

Everything here is computed from the evaluation's metrics dict (the same numbers `dvc metrics
show` prints), its over-optimization points and a few side-by-side answers, so the report can
never disagree with the metrics file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhf.eval.baselines import against_baselines
from rlhf.eval.win_rates import WinRate
from rlhf.reward_sources import JUDGES, REWARD_MODEL, parse

if TYPE_CHECKING:
    from rlhf.eval import plots

Rows = Sequence[Mapping[str, Any]]
REPORT_FILE = "eval.md"

LENGTH_DRIFT = 0.25  # relative change in mean answer length that counts as drift
END_TOKEN_DROP = 0.05  # absolute drop in the share of answers that end
GOLD_DROP = 0.02  # gold score below its peak along training, or below SFT on one task
ROW_LABELS = {
    "gold_sampled": "gold score, sampled",
    "gold_greedy": "gold score, greedy",
    "gold_best_temperature": "gold score, at its best temperature",
    "best_temperature": "best temperature (validation)",
    "rm_sampled": "RM score, sampled",
    "kl_to_sft": "KL to SFT (nats/answer)",
    "kl_to_sft_sampled": "KL to SFT, sampled estimate",
    "response_length": "answer length (tokens)",
    "end_token_rate": "answers that end",
}


def slug(judge: str) -> str:
    """A judge's name as a file name part."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in judge).strip("_")


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _text(answer: str) -> str:
    """An answer as one Markdown table cell."""
    shown = answer.replace("|", "\\|").replace("\n", " ⏎ ").strip()
    return f"`{shown}`" if shown and "`" not in shown else shown or "*(empty)*"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return [*lines, ""]


def policies_table(metrics: Mapping[str, Any]) -> list[str]:
    """Every measure (rows) of every policy (columns), as Markdown lines."""
    policies = list(metrics["kl_to_sft"])
    keys = [k for k in ROW_LABELS if k in metrics]
    return _table(
        ["", *policies], [[ROW_LABELS[k], *(metrics[k][p] for p in policies)] for k in keys]
    )


def _interval(ci: Mapping[str, float | None], prompts: int) -> str:
    """An interval with the count of held-out prompts it was bootstrapped over: on a few dozen
    prompts every interval is wide, and the count says why."""
    if ci["low"] is None or ci["high"] is None:
        return "–"
    return f"{ci['low']:.3f} – {ci['high']:.3f} (n = {prompts})"


def win_rates_table(metrics: Mapping[str, Any], judge: str) -> list[str]:
    """Every pair's win rate by `judge` (ties half, and decisive), each with its interval,
    the tie rate and the greedy win rate, as Markdown lines."""
    rows = [
        [
            pair.replace("_vs_", " vs "),
            rate,
            _interval(metrics["win_rate_ci95"][judge][pair], metrics["prompts"]),
            metrics["win_rate_decisive"][judge][pair],
            _interval(metrics["win_rate_decisive_ci95"][judge][pair], metrics["prompts"]),
            metrics["tie_rate"][judge][pair],
            metrics["win_rate_greedy"][judge][pair],
        ]
        for pair, rate in metrics["win_rate"][judge].items()
    ]
    header = ["pair", "win rate (ties half)", "95% interval", "decisive win rate", "95% interval"]
    return _table([*header, "ties", "greedy win rate"], rows)


def checked_table(metrics: Mapping[str, Any], judge: str) -> list[str]:
    """Per policy, the checker `judge`'s accuracy sampled (with its interval) and greedy, and
    pass@k for each k, as Markdown lines."""
    passes = metrics["pass_at_k"][judge]
    rows = [
        [
            policy,
            value,
            _interval(metrics["accuracy_ci95"][judge][policy], metrics["prompts"]),
            metrics["accuracy_greedy"][judge][policy],
            *passes[policy].values(),
        ]
        for policy, value in metrics["accuracy"][judge].items()
    ]
    header = ["policy", "accuracy, sampled", "95% interval", "accuracy, greedy"]
    return _table([*header, *(f"pass@{k}" for k in next(iter(passes.values())))], rows)


def baselines_table(metrics: Mapping[str, Any]) -> list[str]:
    """Each policy against its strongest baseline by the primary judge (the one it beats
    least), with its interval, then every baseline's win rate, as Markdown lines."""
    judge = metrics["primary_judge"]
    rows = []
    for policy, baselines in against_baselines(metrics, judge).items():
        strongest = baselines[0]
        rows.append(
            [
                policy,
                strongest["baseline"],
                strongest["rate"],
                _interval(strongest["ci95"], metrics["prompts"]),
                "; ".join(f"{b['baseline']}: {b['rate']:.3f}" for b in baselines[1:]),
            ]
        )
    header = ["policy", "strongest baseline", "win rate", "95% interval", "the others"]
    return _table(header, rows)


def ceiling_lines(metrics: Mapping[str, Any]) -> list[str]:
    """What a perfect policy would win against SFT, by each judge with full marks: the most any
    policy can reach, to read the baselines' win rates and their targets against."""
    lines = []
    for judge, by_kind in metrics.get("ceiling", {}).items():
        against = {
            "at its best temperature": by_kind.get("best_temperature"),
            "greedy": by_kind.get("greedy"),
            "sampled": by_kind.get("sampled"),
        }
        shown = ", ".join(
            f"{rate:.3f} against SFT {how}" for how, rate in against.items() if rate is not None
        )
        lines += [
            f"**The ceiling.** Answers with `{judge}`'s full marks on every prompt would win "
            f"{shown}: where SFT's answer has full marks too it is a tie, so no policy can "
            "win more.",
            "",
        ]
    return lines


def best_of_n_table(metrics: Mapping[str, Any]) -> list[str]:
    """Best-of-n at each n: its KL to SFT (measured, and the closed-form bound), scores and
    win rate over SFT by each judge, a judge that is the picking reward model marked."""
    judges = list(next(iter(metrics["best_of_n"].values()))["win_rate"])
    shown = [f"{j} (circular)" if j == REWARD_MODEL else j for j in judges]
    rows = [
        [n, m["kl_to_sft"], m["kl_bound"], m.get("gold_sampled"), m["rm_sampled"],
         *(m["win_rate"][j] for j in judges)]
        for n, m in metrics["best_of_n"].items()
    ]  # fmt: skip
    header = ["n", "KL to SFT", "bound log n - (n-1)/n", "gold score", "RM score"]
    return _table([*header, *(f"win rate over SFT, {j}" for j in shown)], rows)


def warning_signs(
    metrics: Mapping[str, Any], curves: Mapping[str, Rows], policies: Sequence[str]
) -> list[str]:
    """Symptoms of reward hacking users report: length drift, answers that stop ending, and a
    proxy reward that rises while the gold score falls (along training or on one task), and
    greedy answers worse than SFT's, which sampled win rates hide."""
    signs = []
    length, ends = metrics["response_length"], metrics["end_token_rate"]
    for policy in [p for p in policies if p != "sft"]:
        drift = length[policy] / max(length["sft"], 1e-9) - 1
        if abs(drift) > LENGTH_DRIFT:
            why = (
                "reward models often pay for length rather than quality"
                if drift > 0
                else "check the side-by-side answers for cut-short ones"
            )
            signs.append(
                f"**{policy}: length drift.** Answers are {abs(drift):.0%} "
                f"{'longer' if drift > 0 else 'shorter'} than SFT's ({length[policy]:.1f} vs "
                f"{length['sft']:.1f} tokens); {why}."
            )
        if ends["sft"] - ends[policy] > END_TOKEN_DROP:
            signs.append(
                f"**{policy}: answers stop ending.** {ends[policy]:.0%} emit the end token "
                f"(SFT {ends['sft']:.0%})."
            )
        if "gold_sampled" not in metrics:
            continue
        greedy = metrics["gold_greedy"]
        if greedy[policy] < greedy["sft"] - GOLD_DROP:
            signs.append(
                f"**{policy}: greedy answers got worse.** Gold score, greedy: SFT "
                f"{greedy['sft']:.3f} → {policy} {greedy[policy]:.3f}, whatever the sampled "
                "answers gained: training moved the most likely answer away from what the gold "
                "judge wants. Compare policies at their best temperatures and greedy, not only "
                f"sampled; a larger {policy}.kl_coef keeps the policy nearer SFT."
            )
        for task, scores in metrics["by_task"][policy].items():
            sft = metrics["by_task"]["sft"][task]
            if (
                scores["gold_sampled"] < sft["gold_sampled"] - GOLD_DROP
                and scores["rm_sampled"] > sft["rm_sampled"]
            ):
                signs.append(
                    f"**{policy}, {task}: proxy up, gold down.** RM score "
                    f"{sft['rm_sampled']:+.2f} → {scores['rm_sampled']:+.2f} while the gold "
                    f"score fell {sft['gold_sampled']:.3f} → {scores['gold_sampled']:.3f}."
                )
    for policy, curve in curves.items():
        if not curve or any(p["gold_score"] is None for p in curve):
            continue
        peak = max(curve, key=lambda p: p["gold_score"])
        last = curve[-1]
        if last["gold_score"] < peak["gold_score"] - GOLD_DROP and (
            last["rm_score"] >= peak["rm_score"]
        ):
            signs.append(
                f"**{policy} over-optimized the reward model.** The gold score peaked at "
                f"iteration {peak['step']} ({peak['gold_score']:.3f}, KL "
                f"{peak['kl_to_sft']:.2f}) and fell to {last['gold_score']:.3f} (KL "
                f"{last['kl_to_sft']:.2f}) while the RM score rose {peak['rm_score']:+.2f} → "
                f"{last['rm_score']:+.2f}; a larger {policy}.kl_coef or fewer {policy}.steps "
                "stops nearer the peak."
            )
    return signs


def render(
    metrics: Mapping[str, Any],
    *,
    curves: Mapping[str, Rows],
    examples: Sequence[Mapping[str, Any]],
    figures: Mapping[str, str],
) -> str:
    """The whole report. `figures`: caption -> path relative to the report."""
    policies = list(metrics["kl_to_sft"])
    has_gold = "gold_sampled" in metrics
    lines = [
        "# Evaluation report",
        "",
        f"{metrics['prompts']} held-out prompts, never seen in training; per policy one greedy "
        f"answer and {metrics['samples_per_prompt']} answers sampled at temperature "
        f"{metrics['temperature']} per prompt. "
        + (
            "Gold scores come from the task suite's programmatic judge, which plays the human "
            "labeler; RM scores from the reward model the RL policies optimized (in its std "
            "units)."
            if has_gold
            else "These prompts have no gold judge (imported data): RM scores and KL only."
        ),
        "",
    ]
    if "primary_judge" in metrics:
        judge = metrics["primary_judge"]
        circular = (
            " Best-of-n picks by the reward model, so a win rate over it judged by that same "
            "reward model is circular: read it as the proxy it is."
            if judge == REWARD_MODEL
            else ""
        )
        lines += [
            "## Against the baselines",
            "",
            f"Each policy against the cheap alternatives, judged by `{judge}`: SFT at its best "
            "temperature (each policy at its own; both chosen on the validation prompts), SFT's "
            "greedy answers against the policy's, and best-of-n of SFT picked by the reward "
            "model at the KL nearest the policy's. The strongest baseline is the one the policy "
            f"beats least; ties count half; intervals are 95% bootstrap over prompts.{circular}",
            "",
            *baselines_table(metrics),
            *ceiling_lines(metrics),
        ]
        if metrics.get("best_of_n"):
            lines += ["**Best-of-n of SFT** (held-out prompts):", "", *best_of_n_table(metrics)]
    lines += ["## Policies", ""]
    lines += policies_table(metrics)
    for judge in metrics.get("accuracy", {}):
        lines += [
            f"**Answers checked by `{judge}`**, {parse(judge, JUDGES).describe()}: the share "
            "right, and pass@k (a right answer among k of a prompt's samples):",
            "",
            *checked_table(metrics, judge),
        ]
    if metrics.get("win_rate"):
        lines += [
            "## Win rates",
            "",
            "How often a judge prefers the first policy's answer to the second's for the same "
            "prompt: ties counting half, and decisive (wins over wins and losses, ties left "
            "out), with the share of ties; intervals are 95% bootstrap over prompts.",
            "",
        ]
        for judge in metrics["win_rate"]:
            lines += [f"**Judged by `{judge}`**, {parse(judge, JUDGES).describe()}:", ""]
            lines += win_rates_table(metrics, judge)
    signs = warning_signs(metrics, curves, policies)
    lines += ["## Warning signs", ""]
    lines += [f"- {s}" for s in signs] or [
        "None found: no length drift, answers still end, greedy answers no worse than SFT's, "
        "and no gold score falling while the reward-model score rises."
    ]
    lines += ["", "## By task family", ""]
    tasks = list(metrics["by_task"]["sft"])
    shown = ("gold_sampled", "gold_greedy", "rm_sampled", "response_length")
    for key in [k for k in shown if k in metrics]:
        lines += [f"**{ROW_LABELS[key]}**", ""]
        lines += _table(
            ["task", *policies],
            [[t, *(metrics["by_task"][p][t][key] for p in policies)] for t in tasks],
        )
    lines += ["## Figures", ""]
    for caption, path in figures.items():
        lines += [f"**{caption}** (`{path}`)", "", f"![{caption}]({path})", ""]
    for policy, curve in curves.items():
        lines += [f"Over-optimization points of {policy} (iteration 0 is the SFT policy):", ""]
        lines += _table(
            ["iteration", "KL to SFT", "RM score", "gold score"],
            [[p["step"], p["kl_to_sft"], p["rm_score"], p["gold_score"]] for p in curve],
        )
    if examples:
        lines += [
            "## Answers side by side",
            "",
            "The greedy answer and the first sampled answer of each policy to the same prompt.",
            "",
        ]
    for example in examples:
        lines += [f"**{example['task']}:** `{example['prompt']}`", ""]
        lines += _table(
            ["policy", "greedy answer", "gold", "sampled answer", "gold", "RM"],
            [
                [p, _text(a["greedy"]), a["greedy_gold"], _text(a["sampled"]), a["sampled_gold"],
                 a["sampled_rm"]]
                for p, a in example["answers"].items()
            ],
        )  # fmt: skip
    return "\n".join(lines).rstrip() + "\n"


def write(
    directory: Path,
    metrics: Mapping[str, Any],
    *,
    rates: Mapping[str, Mapping[str, WinRate]],
    curves: Mapping[str, Rows],
    examples: Sequence[Mapping[str, Any]],
    losses: Mapping[str, tuple[plots.Curve, plots.Curve]],
) -> None:
    """The report into a new `directory`: eval.md and the figures the data allows.
    `losses`: {stage title: (training loss per step, validation loss per epoch)} for the
    training-curve panels."""
    from rlhf.eval import plots  # matplotlib: not for the flows, which print the tables only

    (directory / "figures").mkdir(parents=True)
    figures: dict[str, str] = {}  # caption -> path relative to the report

    def figure(caption: str, name: str, draw: Callable[[Path], None]) -> None:
        figures[caption] = f"figures/{name}.png"
        draw(directory / figures[caption])

    for judge, by_pair in rates.items():
        figure(
            f"Win rates judged by {judge}",
            f"win_rates_{slug(judge)}",
            lambda path, by_pair=by_pair, judge=judge: plots.win_rates(path, by_pair, judge),
        )
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
    if "temperature_sweep" in metrics:
        by_gold = metrics["primary_judge"] == "gold"
        figure(
            f"{plots.score_label(by_gold)} against KL to SFT: RL policies along training, "
            "best-of-n and SFT at each temperature",
            "score_against_kl",
            lambda path: plots.score_against_kl(
                path, curves, metrics["best_of_n"], metrics["temperature_sweep"]["sft"], by_gold
            ),
        )
    if any(len(curve) > 1 for curve in curves.values()):
        figure(
            "Over-optimization: reward-model and gold score against KL to SFT",
            "overoptimization",
            lambda path: plots.overoptimization_curve(path, curves),
        )
    figure("Training curves", "training", lambda path: plots.training_curves(path, losses))
    text = render(metrics, curves=curves, examples=examples, figures=figures)
    (directory / REPORT_FILE).write_text(text)
