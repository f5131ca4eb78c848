import re

import pytest
from PIL import Image

from rlhf.eval import plots
from rlhf.eval.report import render, warning_signs
from rlhf.eval.win_rates import WinRate

PNG = b"\x89PNG\r\n\x1a\n"


def task_scores(gold: float, rm: float) -> dict[str, float]:
    return {
        "gold_sampled": gold, "gold_greedy": gold, "rm_sampled": rm, "kl_to_sft": 0.0,
        "response_length": 5.0, "end_token_rate": 1.0,
    }  # fmt: skip


def metrics(ppo_length=8.0, ppo_ends=1.0, ppo_add=(0.5, 0.0)) -> dict:
    return {
        "prompts": 10,
        "samples_per_prompt": 2,
        "temperature": 1.0,
        "gold_sampled": {"sft": 0.6, "ppo": 0.7},
        "gold_greedy": {"sft": 0.8, "ppo": 0.8},
        "rm_sampled": {"sft": -0.2, "ppo": 0.3},
        "kl_to_sft": {"sft": 0.0, "ppo": 0.9},
        "response_length": {"sft": 8.0, "ppo": ppo_length},
        "end_token_rate": {"sft": 1.0, "ppo": ppo_ends},
        "by_task": {
            "sft": {"add": task_scores(0.5, 0.0), "greet": task_scores(0.6, 0.1)},
            "ppo": {"add": task_scores(*ppo_add), "greet": task_scores(0.9, 0.5)},
        },
        "win_rate": {"gold": {"ppo_vs_sft": 0.61}},
        "win_rate_ci95": {"gold": {"ppo_vs_sft": {"low": 0.55, "high": 0.66}}},
        "win_rate_decisive": {"gold": {"ppo_vs_sft": 0.74}},
        "win_rate_decisive_ci95": {"gold": {"ppo_vs_sft": {"low": 0.62, "high": 0.85}}},
        "tie_rate": {"gold": {"ppo_vs_sft": 0.5}},
        "win_rate_greedy": {"gold": {"ppo_vs_sft": 0.5}},
    }


def curve(*gold_rm: tuple[float, float]) -> dict[str, list[dict]]:
    """PPO's over-optimization points, one per (gold, RM) score."""
    points = [
        {"step": 10 * i, "kl_to_sft": 0.5 * i, "gold_score": g, "rm_score": r}
        for i, (g, r) in enumerate(gold_rm)
    ]
    return {"ppo": points}


def test_a_healthy_run_has_no_warning_signs():
    assert warning_signs(metrics(), curve((0.6, -0.2), (0.7, 0.3)), ["sft", "ppo"]) == []


def test_length_drift_and_answers_that_stop_ending_are_flagged():
    signs = warning_signs(metrics(ppo_length=12.0, ppo_ends=0.8), {}, ["sft", "ppo"])
    assert len(signs) == 2
    assert "length drift" in signs[0] and "50% longer" in signs[0]
    assert "80% emit the end token (SFT 100%)" in signs[1]


def test_proxy_up_gold_down_is_flagged_per_task_and_along_training():
    per_task = warning_signs(metrics(ppo_add=(0.3, 0.4)), {}, ["sft", "ppo"])
    assert len(per_task) == 1 and "ppo, add: proxy up, gold down" in per_task[0]
    along = warning_signs(metrics(), curve((0.6, -0.2), (0.75, 0.2), (0.65, 0.6)), ["sft", "ppo"])
    assert len(along) == 1 and "peaked at iteration 10 (0.750" in along[0]
    assert along[0].startswith("**ppo over-optimized the reward model.**")
    # gold falling while the proxy falls too is not over-optimization
    assert warning_signs(metrics(), curve((0.6, 0.5), (0.75, 0.6), (0.65, 0.2)), ["sft"]) == []


def test_greedy_answers_worse_than_sfts_are_flagged():
    """The committed default's PPO: sampled win rate over SFT 0.56, greedy gold 0.846 → 0.792."""
    worse = metrics() | {"gold_greedy": {"sft": 0.846, "ppo": 0.792}}
    (sign,) = warning_signs(worse, {}, ["sft", "ppo"])
    assert sign.startswith("**ppo: greedy answers got worse.** Gold score, greedy: SFT 0.846")
    assert "a larger ppo.kl_coef" in sign
    within = metrics() | {"gold_greedy": {"sft": 0.846, "ppo": 0.830}}  # less than GOLD_DROP
    assert warning_signs(within, {}, ["sft", "ppo"]) == []


def test_report_tables_come_from_the_metrics(tmp_path):
    examples = [
        {
            "task": "add",
            "prompt": "Compute 1 + 2.",
            "answers": {
                "sft": {"greedy": "1 + 2 = 3.", "greedy_gold": 1.0, "sampled": "a | b",
                        "sampled_gold": 0.2, "sampled_rm": -0.5},
                "ppo": {"greedy": "3", "greedy_gold": 0.8, "sampled": "", "sampled_gold": 0.0,
                        "sampled_rm": -1.0},
            },
        }
    ]  # fmt: skip
    text = render(
        metrics(),
        curves=curve((0.6, -0.2), (0.7, 0.3)),
        examples=examples,
        figures={"Win rates": "figures/win_rates.png"},
    )
    assert "| gold score, sampled | 0.600 | 0.700 |" in text
    row = "| ppo vs sft | 0.610 | 0.550 – 0.660 (n = 10) | 0.740 | 0.620 – 0.850 (n = 10) |"
    assert row + " 0.500 | 0.500 |" in text
    assert "**Judged by `gold`**, the task suite's programmatic judge" in text
    assert "Over-optimization points of ppo" in text
    assert "| add | 0.500 | 0.500 |" in text  # gold by task
    assert "![Win rates](figures/win_rates.png)" in text
    assert "| sft | `1 + 2 = 3.` | 1.000 | `a \\| b` | 0.200 | -0.500 |" in text
    assert "*(empty)*" in text
    assert "None found" in text
    # every table row has as many cells as its header
    for table in re.findall(r"((?:^\|.*\|\n)+)", text, flags=re.M):
        rows = table.strip().splitlines()
        widths = {len(re.split(r"(?<!\\)\|", row)) for row in rows}
        assert len(widths) == 1, table


def test_figures_are_written_as_png(tmp_path):
    rate = WinRate(
        0.6, 0.55, 0.66, tie_rate=0.2, decisive=0.62, decisive_low=0.5, decisive_high=0.7
    )
    plots.win_rates(tmp_path / "w.png", {"ppo_vs_sft": rate}, "gold")
    plots.scores_by_task(
        tmp_path / "t.png",
        {"sft": {"all": 0.6, "add": 0.5}, "ppo": {"all": 0.7, "add": 0.4}},
        "Gold score by task",
        "gold score",
    )
    curves = curve((0.6, -0.2), (0.7, 0.3), (0.6, 0.5)) | {
        "grpo": curve((0.6, -0.2), (0.65, 0.1))["ppo"]
    }
    plots.overoptimization_curve(tmp_path / "o.png", curves)
    train, val = [(s, 1 / s) for s in range(1, 11)], [(5, 0.5), (10, 0.4)]
    plots.training_curves(tmp_path / "c.png", {"SFT": (train, val), "DPO": (train, val)})
    for name in ("w", "t", "o", "c"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == PNG
        with Image.open(tmp_path / f"{name}.png") as image:  # a drawn figure, not a blank
            width, height = image.size
            colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
        assert width >= 400 and height >= 150
        assert colours is None or len(colours) > 50  # lines, bars and anti-aliased text


@pytest.mark.parametrize(
    ("by_gold", "label", "best_of_n_score"), [(True, "Gold score", 0.65), (False, "RM score", 0.1)]
)
def test_the_score_against_kl_figure_names_its_judge_and_plots_its_scores(
    tmp_path, monkeypatch, by_gold, label, best_of_n_score
):
    """Title and y axis say whose score it is, and the points are that judge's."""
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig))
    best_of_n = {"2": {"kl_to_sft": 0.2, "gold_sampled": 0.65, "rm_sampled": 0.1}}
    temperatures = {
        "0.7": {"kl_to_sft": 0.3, "score": 0.7},
        "1.0": {"kl_to_sft": 0.0, "score": 0.6},
    }
    plots.score_against_kl(tmp_path / "k.png", curve((0.6, -0.2)), best_of_n, temperatures, by_gold)
    (ax,) = drawn[0].axes
    assert ax.get_title().startswith(f"{label} against KL to SFT")
    assert ax.get_ylabel() == label
    policy, best_of, *_ = ax.get_lines()
    assert list(policy.get_ydata()) == [0.6 if by_gold else -0.2]
    assert list(best_of.get_ydata()) == [best_of_n_score]
