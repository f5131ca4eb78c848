"""The evaluation report's figures, drawn with matplotlib's object API.

`Figure` objects render through the Agg canvas without pyplot, so nothing here depends on a
display or on global pyplot state, and figures drawn in one process never leak into the next.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from rlhf.eval.win_rates import WinRate

POLICY_COLORS = {
    "sft": "tab:gray",
    "ppo": "tab:blue",
    "dpo": "tab:orange",
    "reinforce": "tab:green",
    "rloo": "tab:brown",
    "grpo": "tab:red",
}
Rows = Sequence[Mapping[str, str | float]]
Curve = Sequence[tuple[int, float]]  # (step, value) points


def _color(policy: str) -> str:
    return POLICY_COLORS.get(policy, "tab:purple")


def _save(fig: Figure, path: Path) -> None:
    """Every figure is laid out "constrained", which already fits its labels, annotations and
    legends inside it: `bbox_inches="tight"` would draw each figure a second time to crop."""
    fig.savefig(path, dpi=110)


def _column(rows: Rows, key: str) -> list[float]:
    return [float(r[key]) for r in rows]


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average, so the trend of a noisy per-step series is readable."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def _loss_panel(ax: Axes, train: Curve, val: Curve, title: str, ylabel: str) -> None:
    """Per-step training loss (raw and smoothed) with the validation loss at each epoch's end."""
    x, loss = [step for step, _ in train], [value for _, value in train]
    ax.plot(x, loss, color="tab:blue", alpha=0.25, linewidth=0.8)
    ax.plot(x, _smooth(loss, max(1, len(loss) // 25)), color="tab:blue", label="train (smoothed)")
    ax.plot([step for step, _ in val], [value for _, value in val], "o-", color="tab:red",
            label="validation")  # fmt: skip
    ax.set(title=title, xlabel="optimizer step", ylabel=ylabel)
    ax.legend()
    ax.grid(alpha=0.3)


def training_curves(path: Path, losses: Mapping[str, tuple[Curve, Curve]]) -> None:
    """One loss panel per trained stage: {title: (training loss per step, validation loss at
    each epoch's last step)}."""
    fig = Figure(figsize=(5.5 * len(losses), 4), layout="constrained")
    axes = fig.subplots(1, len(losses), squeeze=False)[0]
    for ax, (title, (train, val)) in zip(axes, losses.items(), strict=True):
        _loss_panel(ax, train, val, title, "training loss")
    _save(fig, path)


def overoptimization_curve(path: Path, curves: Mapping[str, Rows]) -> None:
    """Gold and proxy (reward-model) score against KL to SFT along each RL policy's training
    (Gao et al.), one line per policy.

    One panel per score, sharing the KL axis: the scores have different units, and twin y
    axes would scale any two rising series onto the same line. The dotted line is the SFT
    policy (every curve's first point); each point is labelled with its iteration.
    """
    points = [p for rows in curves.values() for p in rows]
    panels = [("rm_score", "reward-model score (std units)")]
    if all(p["gold_score"] is not None for p in points):
        panels.insert(0, ("gold_score", "gold score (0-1)"))
    fig = Figure(figsize=(7.5, 2.2 + 2.6 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (key, ylabel) in zip(axes, panels, strict=True):
        for policy, rows in curves.items():
            kl, y = _column(rows, "kl_to_sft"), _column(rows, key)
            ax.plot(kl, y, "o-", color=_color(policy), label=policy)
            for point, xy in zip(rows, zip(kl, y, strict=True), strict=True):
                ax.annotate(
                    str(int(float(point["step"]))), xy, xytext=(0, 6),
                    textcoords="offset points", ha="center", fontsize=8, color="dimgray",
                )  # fmt: skip
        first = next(iter(curves.values()))[0]
        ax.axhline(float(first[key]), color="black", linestyle=":", linewidth=1, label="SFT")
        ax.set_ylabel(ylabel)
        ax.margins(y=0.2)
        ax.legend(loc="best")
        ax.grid(alpha=0.3)
    axes[0].set_title("Over-optimization along RL training (point labels: iteration)")
    axes[-1].set_xlabel("KL to the SFT policy (nats per answer)")
    _save(fig, path)


def score_label(by_gold: bool) -> str:
    """What the score-against-KL figure plots: the gold judge's score, else the reward model's
    (the primary judge of a run on your own data)."""
    return "Gold score" if by_gold else "RM score"


def score_against_kl(
    path: Path,
    curves: Mapping[str, Rows],
    best_of_n: Mapping[str, Mapping[str, float]],
    sft_temperatures: Mapping[str, Mapping[str, float]],
    by_gold: bool,
) -> None:
    """RL and its cheap alternatives on one picture (Gao et al. 2022): the gold judge's score
    (`by_gold`, else the reward model's) against KL to SFT along each RL policy's training (its
    snapshots), best-of-n of SFT at each n (`best_of_n`: n -> its measures; held-out prompts)
    and SFT at each swept temperature (`sft_temperatures`: t -> score and KL; validation
    prompts). A policy above the best-of-n line at the same KL gained more than the reward
    model alone could pick."""
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.subplots()
    label = score_label(by_gold)
    point_key, sampled_key = (
        ("gold_score", "gold_sampled") if by_gold else ("rm_score", "rm_sampled")
    )
    for policy, rows in curves.items():
        ax.plot(_column(rows, "kl_to_sft"), _column(rows, point_key), "o-", color=_color(policy),
                label=f"{policy} along training")  # fmt: skip
    if best_of_n:
        ns = list(best_of_n)
        kl = [float(best_of_n[n]["kl_to_sft"]) for n in ns]
        score = [float(best_of_n[n][sampled_key]) for n in ns]
        ax.plot(kl, score, "s--", color="black", label="best-of-n of SFT (RM picks)")
        for n, xy in zip(ns, zip(kl, score, strict=True), strict=True):
            ax.annotate(f"n={n}", xy, xytext=(4, -10), textcoords="offset points", fontsize=8)
    for i, (t, point) in enumerate(sft_temperatures.items()):
        xy = (float(point["kl_to_sft"]), float(point["score"]))
        entry = "SFT at temperature T (validation prompts)" if i == 0 else None
        ax.plot(*xy, "D", color=_color("sft"), markersize=6, label=entry)
        ax.annotate(f"SFT T={t}", xy, xytext=(4, 4), textcoords="offset points", fontsize=8)
    ax.set(
        title=f"{label} against KL to SFT: RL, best-of-n and SFT's temperatures",
        xlabel="KL to the SFT policy (nats per answer, exact)",
        ylabel=label,
    )
    ax.legend(loc="best")
    ax.grid(alpha=0.3)
    _save(fig, path)


def win_rates(path: Path, rates: Mapping[str, WinRate], judge: str) -> None:
    """Each pair's win rate by `judge` with its 95% interval; 0.5 is no preference."""
    names = list(rates)
    fig = Figure(figsize=(7, 1.2 + 0.6 * len(names)), layout="constrained")
    ax = fig.subplots()
    values = [rates[n].rate for n in names]
    errors = [
        [rates[n].rate - rates[n].low for n in names],
        [rates[n].high - rates[n].rate for n in names],
    ]
    ax.barh(names, values, xerr=errors, color="tab:blue", alpha=0.8, capsize=4)
    for y, value in enumerate(values):
        ax.text(0.02, y, f"{value:.3f}", va="center", color="white", fontweight="bold")
    ax.axvline(0.5, color="black", linestyle=":", label="no preference")
    ax.set(
        xlim=(0, 1),
        title=f"Win rate judged by {judge}, ties half (bars: 95% bootstrap interval)",
        xlabel="win rate of the first policy over the second",
    )
    ax.set_yticks(range(len(names)), [n.replace("_vs_", " vs ") for n in names])
    ax.legend(loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path)


def scores_by_task(
    path: Path, by_policy: Mapping[str, Mapping[str, float]], title: str, ylabel: str
) -> None:
    """Grouped bars: one group per task family (and `all`), one labelled bar per policy."""
    groups = list(next(iter(by_policy.values())))
    width = 0.8 / len(by_policy)
    fig = Figure(figsize=(max(7.0, 1.2 * len(groups)), 4.5), layout="constrained")
    ax = fig.subplots()
    for i, (policy, scores) in enumerate(by_policy.items()):
        x = [g + (i - (len(by_policy) - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(x, [scores[g] for g in groups], width, label=policy, color=_color(policy))
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.set_xticks(range(len(groups)), groups)
    ax.set(title=title, ylabel=ylabel, ylim=(0, 1.1))
    ax.legend(title="policy", ncols=len(by_policy), loc="upper center", bbox_to_anchor=(0.5, -0.08))
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)
