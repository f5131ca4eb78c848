"""The cheap alternatives an RLHF run must beat, and what the evaluation reports of them.

A skeptic's first tries at a better model without RL: decode SFT better (a lower sampling
temperature; greedy decoding), or sample it n times and keep the reward model's favourite
(best-of-n, `rlhf.eval.best_of_n`). Each policy is judged against each: at its own best
temperature against SFT at its best, greedy against greedy, and against the best-of-n whose KL
to SFT is nearest its own. Best temperatures are chosen on the validation prompts, so the
held-out win rates stay honest.

Metric keys are a contract: `best_temperature.<policy>`, `temperature_sweep.<policy>.<t>`
(`score`, `kl_to_sft`), `win_rate_best_temperature[_ci95].<judge>.<a>_vs_<b>`,
`win_rate_greedy_ci95.<judge>.<a>_vs_<b>`, `best_of_n.<n>.*`, `best_of_n_matched.<policy>` and
`win_rate_vs_best_of_n[_ci95].<judge>.<policy>`, and `ceiling.<judge>.<kind>` for a judge
with full marks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlhf.eval.answers import ScoredAnswers
from rlhf.eval.best_of_n import kl_bound
from rlhf.eval.summary import RATE_FIELDS
from rlhf.eval.win_rates import WinRate, win_rate
from rlhf.reward_sources import GOLD, JUDGES, REWARD_MODEL, parse

SFT = "sft"
Rates = Mapping[str, Mapping[str, WinRate]]  # judge -> pair -> its win rate
FULL_MARKS = {GOLD: 1.0}  # the judges whose top score is known: the gold judge's is 1


def bon_name(n: int) -> str:
    return f"best_of_{n}"


def primary_judge(judges: Sequence[str]) -> str:
    """The judge that chooses best temperatures and names the strongest baseline: the first
    of `judges` that scores single answers (`gold` on the task suite), else the reward model."""
    return next((j for j in judges if not parse(j, JUDGES).pairwise), REWARD_MODEL)


def mean_score(answers: ScoredAnswers, judge: str) -> float:
    scores = answers.judged_by(judge)
    return sum(scores) / len(scores)


def best_temperature(sweep: Mapping[float, ScoredAnswers], judge: str) -> float:
    """The temperature whose answers `judge` scores best; the first listed among equals."""
    return max(sweep, key=lambda t: mean_score(sweep[t], judge))


def sweep_summary(sweep: Mapping[float, ScoredAnswers], judge: str) -> dict[str, dict[str, float]]:
    """Per temperature (as a metrics key), the judge's mean score and the KL to SFT."""
    return {
        str(t): {"score": round(mean_score(a, judge), 4), "kl_to_sft": a.means()["kl"] or 0.0}
        for t, a in sweep.items()
    }


def nearest_n(kl: float, bon_kl: Mapping[int, float]) -> int:
    """The best-of-n whose KL to SFT is nearest `kl`; the smaller n among equals."""
    return min(bon_kl, key=lambda n: (abs(bon_kl[n] - kl), n))


_rate, _interval = RATE_FIELDS["win_rate"], RATE_FIELDS["win_rate_ci95"]


def rate_metrics(key: str, rates: Rates) -> dict[str, Any]:
    """`key` and `key_ci95`, each {judge: {pair: value}}."""
    return {
        key: {j: {pair: _rate(r) for pair, r in by.items()} for j, by in rates.items()},
        f"{key}_ci95": {
            j: {pair: _interval(r) for pair, r in by.items()} for j, by in rates.items()
        },
    }


def best_of_n_metrics(
    bon: Mapping[int, ScoredAnswers], rates: Mapping[int, Rates]
) -> dict[str, dict[str, Any]]:
    """Per n: the measures a policy gets, the closed-form KL bound, and the win rate over SFT
    (with its interval) by each judge."""
    summary = {}
    for n, answers in bon.items():
        means = answers.means()
        pair = f"{bon_name(n)}_vs_{SFT}"
        summary[str(n)] = {
            "gold_sampled": means["gold"],
            "rm_sampled": means["reward"],
            "kl_to_sft": means["kl"],
            "kl_to_sft_sampled": means["kl_sampled"],
            "kl_bound": round(kl_bound(n), 4),
            "win_rate": {j: _rate(by[pair]) for j, by in rates[n].items()},
            "win_rate_ci95": {j: _interval(by[pair]) for j, by in rates[n].items()},
        }
    return summary


def matched_metrics(matched: Mapping[str, int], rates: Mapping[str, Rates]) -> dict[str, Any]:
    """Each policy against the best-of-n nearest its KL (`matched`: policy -> n; `rates`:
    policy -> judge -> pair -> win rate)."""
    judges = next(iter(rates.values()), {})
    by_judge = {
        judge: {p: rates[p][judge][f"{p}_vs_{bon_name(n)}"] for p, n in matched.items()}
        for judge in judges
    }
    return {
        "best_of_n_matched": dict(matched),
        "win_rate_vs_best_of_n": {
            j: {p: _rate(r) for p, r in by.items()} for j, by in by_judge.items()
        },
        "win_rate_vs_best_of_n_ci95": {
            j: {p: _interval(r) for p, r in by.items()} for j, by in by_judge.items()
        },
    }


def ceiling(answers: Mapping[str, Mapping[str, ScoredAnswers]], judge: str) -> dict[str, float]:
    """Per kind of SFT's answers ("sampled", "greedy", "best_temperature"), the win rate an
    answer with `judge`'s full marks would reach against them, ties half: no policy can beat
    it. Where SFT already earns full marks on most prompts, a target near it asks for a
    perfect policy. `judge` is one of FULL_MARKS."""
    top = FULL_MARKS[judge]
    scores = {kind: by_policy[SFT].judged_by(judge) for kind, by_policy in answers.items()}
    return {kind: round(win_rate([top] * len(s), s), 4) for kind, s in scores.items()}


def baseline_metrics(
    answers: Mapping[str, Mapping[str, ScoredAnswers]],
    sweep: Mapping[str, Mapping[float, ScoredAnswers]],
    bon: Mapping[int, ScoredAnswers],
    judge: str,
    judged: Callable[[Mapping[str, ScoredAnswers]], Rates],
) -> dict[str, Any]:
    """Every baseline's metrics. `answers`: {"sampled" | "greedy" | "best_temperature":
    {policy: its held-out answers}}; `sweep`: each policy's validation answers by temperature;
    `bon`: best-of-n's answers by n; `judge`: the primary judge; `judged`: the win rates of
    every later policy of a dict over every earlier one, by each judge. The greedy win rates
    are the evaluation's own (`summary.summarize`)."""
    sampled = answers["sampled"]
    bon_rates = {n: judged({SFT: sampled[SFT], bon_name(n): a}) for n, a in bon.items()}
    bon_kl = {n: a.means()["kl"] or 0.0 for n, a in bon.items()}
    matched = {
        p: nearest_n(a.means()["kl"] or 0.0, bon_kl) for p, a in sampled.items() if p != SFT and bon
    }
    matched_rates = {p: judged({bon_name(n): bon[n], p: sampled[p]}) for p, n in matched.items()}
    return {
        "primary_judge": judge,
        "best_temperature": {p: best_temperature(by_t, judge) for p, by_t in sweep.items()},
        "temperature_sweep": {p: sweep_summary(by_t, judge) for p, by_t in sweep.items()},
        **rate_metrics("win_rate_best_temperature", judged(answers["best_temperature"])),
        "best_of_n": best_of_n_metrics(bon, bon_rates),
        **(matched_metrics(matched, matched_rates) if matched else {}),
        "ceiling": {judge: ceiling(answers, judge)} if judge in FULL_MARKS else {},
    }


def against_baselines(metrics: Mapping[str, Any], judge: str) -> dict[str, list[dict[str, Any]]]:
    """Per policy, each baseline it was judged against by `judge`, the strongest (the one it
    beats least) first: {name, win rate, 95% interval}."""
    pairs = {
        "SFT at its best temperature": ("win_rate_best_temperature", "{p}_vs_sft"),
        "SFT greedy (greedy vs greedy)": ("win_rate_greedy", "{p}_vs_sft"),
    }
    table: dict[str, list[dict[str, Any]]] = {}
    for policy in [p for p in metrics["kl_to_sft"] if p != SFT]:
        rows = []
        for name, (key, pair) in pairs.items():
            if judge in metrics.get(key, {}):
                at = pair.format(p=policy)
                ci = metrics.get(f"{key}_ci95", {}).get(judge, {}).get(at)
                rows.append({"baseline": name, "rate": metrics[key][judge][at], "ci95": ci})
        if policy in metrics.get("win_rate_vs_best_of_n", {}).get(judge, {}):
            n = metrics["best_of_n_matched"][policy]
            kl = metrics["best_of_n"][str(n)]["kl_to_sft"]
            rows.append(
                {
                    "baseline": f"best-of-{n} of SFT (KL {kl:.2f})",
                    "rate": metrics["win_rate_vs_best_of_n"][judge][policy],
                    "ci95": metrics["win_rate_vs_best_of_n_ci95"][judge][policy],
                }
            )
        table[policy] = sorted(rows, key=lambda row: row["rate"])
    return table
