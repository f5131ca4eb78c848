"""The plots `dvc plots show` draws (dvc.yaml's top-level `plots`): each titled, with axis
labels, and one line or colour per policy where several are drawn together.

The training curves are dvclive's files, one TSV per metric (`rlhf.train.curves`); a stage
writes more of them than a person reads (the learning rate of a constant schedule, the KL
coefficient of a fixed one, the update passes run), so only the curves named here are drawn,
the rest stay outputs a script can read. The RL algorithms' curves share a plot per metric,
one line per algorithm in `rl_algorithms` (dvc.yaml is generated for its value: `rlhf
dvc-yaml` after changing it adds the new algorithm's lines). The over-optimization points of
evaluate are drawn twice, gold and reward-model score apart (their units differ), coloured by
policy through the template in `.dvc/plots/` (`BY_POLICY`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlhf.project import paths

BY_POLICY = "by_policy"  # .dvc/plots/by_policy.json: a scatter joined in step order per policy
LOSS = "loss (nats per token)"
PAIR_LOSS = "loss (nats per comparison)"


@dataclass(frozen=True)
class CurvePlot:
    title: str
    y_label: str
    metrics: tuple[str, ...]  # the metrics drawn together (TSV stems in the curves folder)


def loss_plots(stage: str, y_label: str) -> tuple[CurvePlot, ...]:
    """What the shared training loop logs for every trained stage."""
    return (
        CurvePlot(f"{stage}: training loss per step", y_label, ("train_loss",)),
        CurvePlot(
            f"{stage}: loss per epoch, training and validation",
            y_label,
            ("epoch/train_loss", "epoch/val_loss"),
        ),
        CurvePlot(f"{stage}: learning rate", "learning rate", ("lr",)),
    )


# trained stage (its curves folder's name) -> what of its curves is drawn
SUPERVISED = {
    "sft": loss_plots("SFT", LOSS),
    "rm": loss_plots("Reward model", PAIR_LOSS),
    "dpo": (
        *loss_plots("DPO", PAIR_LOSS),
        CurvePlot(
            "DPO: how often the implicit reward prefers the chosen answer, per epoch",
            "reward accuracy (validation)",
            ("epoch/reward_accuracy",),
        ),
        CurvePlot(
            "DPO: log-probability of the chosen and rejected answers, per epoch",
            "log-probability (nats per answer)",
            ("epoch/chosen_logp", "epoch/rejected_logp"),
        ),
    ),
}
# what every RL algorithm logs each iteration, drawn one line per algorithm
RL = (
    CurvePlot("RL: reward-model score of the sampled answers", "RM score (std units)", ("score",)),
    CurvePlot("RL: KL to SFT of the sampled answers", "KL (nats per answer)", ("kl",)),
    CurvePlot("RL: entropy of the policy", "entropy (nats per token)", ("entropy",)),
    CurvePlot("RL: answer length", "tokens per answer", ("response_length",)),
    CurvePlot("RL: share of answers that end", "end-token rate", ("end_token_rate",)),
    CurvePlot("RL: policy loss", "loss", ("policy_loss",)),
    CurvePlot("RL: KL between the policy before and after an update", "approx. KL", ("approx_kl",)),
    CurvePlot(
        "RL: sampler and trainer log-probabilities, mean gap",
        "nats per token",
        ("logprob_mismatch",),
    ),
)


def curve_file(folder: str, metric: str) -> str:
    return str(paths.curves_folder(folder) / f"{metric}.tsv")


def curve_entry(title: str, y_label: str, files: dict[str, str]) -> dict[str, Any]:
    return {title: {"x": "step", "x_label": "step", "y_label": y_label, "y": files}}


def overoptimization_plots() -> list[dict[str, Any]]:
    """Gold and reward-model score against KL to SFT along RL training, apart."""
    curve = str(paths.EVAL_CURVE)
    scores = (
        ("gold_score", "gold score", "gold score (0-1)"),
        ("rm_score", "reward-model score", "RM score (std units)"),
    )
    return [
        {
            title: {
                "template": BY_POLICY,
                "x": "kl_to_sft",
                "x_label": "KL to the SFT policy (nats per answer)",
                "y_label": y_label,
                "y": {curve: column},
            }
        }
        for column, title, y_label in (
            (column, f"Over-optimization: {name} against KL to SFT, by policy", y_label)
            for column, name, y_label in scores
        )
    ]


def top_level_plots(rl_algorithms: Sequence[str]) -> list[dict[str, Any]]:
    """dvc.yaml's `plots`, for a pipeline that trains `rl_algorithms`."""
    plots = overoptimization_plots()
    for stage, curve_plots in SUPERVISED.items():
        for plot in curve_plots:
            files = {curve_file(stage, m): m.rpartition("/")[2] for m in plot.metrics}
            plots.append(curve_entry(plot.title, plot.y_label, files))
    for plot in RL:
        (metric,) = plot.metrics
        files = {curve_file(algorithm, metric): metric for algorithm in rl_algorithms}
        plots.append(curve_entry(plot.title, plot.y_label, files))
    return plots
