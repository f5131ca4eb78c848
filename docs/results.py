"""The results of README.md and docs/results.md, written from the committed measurements so no
sentence or table that states a figure can go stale.

    python docs/results.py                        # rewrite the generated blocks
    python docs/results.py --check                # exit 1, naming the file, when one is stale
    python docs/results.py --record-time SECONDS  # after timing the default's `dvc repro`

Two generated blocks, each between `<!-- NAME:begin -->` and `<!-- NAME:end -->`:

- `results` (README.md and docs/results.md, the same text): how long the default's `dvc repro`
  takes (docs/run-time.json: the one place the run time is stated; other pages link to it),
  the spread over seeds of the headline numbers (docs/seeds.json, `rlhf compare --json`),
  issue 45's targets against it, what the numbers say, then the committed run in full
  (metrics/details/eval.json and metrics/details/rm.json, what `dvc repro` committed),
  through the same tables reports/eval.md shows.
- `findings` (docs/results.md): the committed run by task family, what the reward model
  judges worst, and the gold score along RL training (metrics/eval_overoptimization.csv).

A number docs/seeds.json or the metrics lack (written before the evaluation measured it) is
shown as not measured, never guessed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from rlhf.eval.report import GOLD_DROP, ROW_LABELS, policies_table, win_rates_table  # noqa: E402
from rlhf.eval.seeds import POLICY_FILE, compared_numbers  # noqa: E402
from rlhf.project import paths  # noqa: E402
from rlhf.project.experiments import read_run  # noqa: E402
from rlhf.project.metric_files import read_metrics  # noqa: E402
from rlhf.reward_sources import REWARD_MODEL  # noqa: E402
from rlhf.stages.evaluate import SPEC as EVALUATE  # noqa: E402

README, RESULTS_PAGE = ROOT / "README.md", ROOT / "docs" / "results.md"
# the committed run's report figures the results page shows: copied beside it, since the
# report is a DVC output the docs site cannot reach (file name -> caption)
FIGURES = {
    "score_against_kl.png": "Gold score against KL to SFT: the RL policies along training, "
    "best-of-n of SFT at each n, and SFT at each temperature",
    "win_rates_gold.png": "Win rates over SFT judged by the gold judge, with 95% intervals",
    "overoptimization.png": "Over-optimization: reward-model and gold score against KL to SFT",
}
FIGURE_FOLDER = ROOT / "docs" / "figures"
REPORT_FIGURES = ROOT / paths.REPORTS / "figures"  # where the committed report drew them
BLOCKS = {"results": (README, RESULTS_PAGE), "findings": (RESULTS_PAGE,)}  # name -> its pages
JUDGE = "gold"
SFT = "sft"
SEEDS = ROOT / "docs" / "seeds.json"  # `rlhf compare --json` of the default at several seeds
COMMITTED_CPU = ROOT / "docs" / "committed-cpu.json"  # the CPU that made the committed outputs
RUN_TIME = ROOT / "docs" / "run-time.json"  # `--record-time`: the default's whole `dvc repro`
RECORD_TIME = "python docs/results.py --record-time SECONDS"
Compared = Mapping[str, Any]  # docs/seeds.json: {"seeds": {seed: {key: value}}, "spread": ...}
Metrics = Mapping[str, Any]


@dataclass(frozen=True)
class Comparison:
    """One way a policy meets a baseline of SFT's: its win-rate metric (`metric.<judge>.<pair>`
    in the metrics, its interval under `metric_ci95`), the pair as a pattern of the policy's
    name, a label for the seeds table and a title for the claims."""

    metric: str
    pair: str
    label: str
    title: str

    def key(self, policy: str, judge: str = JUDGE) -> str:
        return f"{self.metric}.{judge}.{self.pair.format(policy)}"

    def interval_key(self, policy: str, judge: str = JUDGE) -> str:
        return f"{self.metric}_ci95.{judge}.{self.pair.format(policy)}"


SAMPLED = Comparison(
    "win_rate", "{}_vs_sft", "win rate over SFT, sampled", "Sampled, against SFT sampled"
)
BEST_TEMPERATURE = Comparison(
    "win_rate_best_temperature",
    "{}_vs_sft",
    "win rate over SFT, each at its best temperature",
    "Each at its best temperature, against SFT at its best",
)
GREEDY = Comparison(
    "win_rate_greedy", "{}_vs_sft", "win rate over SFT, greedy", "Greedy, against SFT greedy"
)
BEST_OF_N = Comparison(
    "win_rate_vs_best_of_n",
    "{}",
    "win rate over best-of-n of SFT at the nearest KL",
    "Against best-of-n of SFT at the nearest KL",
)
COMPARISONS = (SAMPLED, BEST_TEMPERATURE, GREEDY, BEST_OF_N)
# the seeds table's rows after the win rates: measures every policy has (labels as in the report)
MEASURES = ("gold_sampled", "gold_greedy", "kl_to_sft")


def policy_of(key: str) -> str | None:
    """The policy an `rlhf compare` key is of (`eval/ppo:win` -> `ppo`); None for a number
    of another file (`rm:acc`)."""
    file, prefix = key.partition(":")[0], POLICY_FILE.format(policy="")
    return file.removeprefix(prefix) if file.startswith(prefix) else None


def compared_key(policy: str, metric: str) -> str:
    """The `rlhf compare` key (docs/seeds.json) of `policy`'s `metric` (`win_rate`,
    `kl_to_sft`): its headline file and short key, `eval/ppo:win`."""
    short = next(k for k, path in EVALUATE.headline.items() if path.split(".")[0] == metric)
    return f"{POLICY_FILE.format(policy=policy)}:{short}"


@dataclass(frozen=True)
class Target:
    """A number from docs/seeds.json whose mean over the seeds must reach `threshold`; for a
    win rate over SFT, `ceiling` names which of SFT's answers it is against (the ceiling's
    key in the evaluation's details: what a perfect policy would reach)."""

    key: str
    threshold: float
    says: str
    ceiling: str | None = None


TARGET_POLICIES = ("ppo", "dpo", "grpo")  # issue 45 sets its targets for these
TARGETS_PER_POLICY = (
    (
        BEST_TEMPERATURE,
        0.60,
        "{} at its best temperature beats SFT at its best",
        "best_temperature",
    ),
    (GREEDY, 0.55, "{} greedy beats SFT greedy", "greedy"),
    (
        BEST_OF_N,
        0.50,
        "{}'s gold score is at least that of best-of-n of SFT at the nearest KL",
        None,
    ),
)
ANSWERS_OF_SFT = {"best_temperature": "at its best temperature", "greedy": "greedy"}
RM_TARGET = Target(
    "rm:acc", 0.90, "The reward model orders held-out comparisons as the gold judge does"
)


def targets(policies: Sequence[str] = TARGET_POLICIES) -> list[Target]:
    """Issue 45's targets: per policy, its win rates against SFT's cheap baselines; then the
    reward model's gold accuracy."""
    per_policy = [
        Target(compared_key(policy, c.metric), threshold, says.format(name(policy)), ceiling)
        for policy in policies
        for c, threshold, says, ceiling in TARGETS_PER_POLICY
    ]
    return [*per_policy, RM_TARGET]


def name(policy: str) -> str:
    """A policy as prose names it: `ppo` -> PPO."""
    return policy.upper()


def number(value: float) -> str:
    """A figure as the tables show it (no negative zero)."""
    return f"{value + 0.0:.3f}"


def listed(items: Sequence[str]) -> str:
    return ", ".join(items) if items else "none"


def lookup(metrics: Metrics, dotted: str) -> Any:
    """The value at a dotted metrics key (`win_rate.gold.ppo_vs_sft`), None where missing."""
    here: Any = metrics
    for part in dotted.split("."):
        if not isinstance(here, Mapping) or part not in here:
            return None
        here = here[part]
    return here


def seed_values(compared: Compared, key: str) -> dict[str, float]:
    """Each seed's value of `key` (an `rlhf compare` key, `eval/ppo:win`), for the seeds that
    measured it, in seed order."""
    return {
        seed: numbers[key]
        for seed, numbers in sorted(compared["seeds"].items(), key=lambda item: int(item[0]))
        if key in numbers
    }


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return [*lines, *("| " + " | ".join(row) + " |" for row in rows), ""]


def duration(seconds: float) -> str:
    """`650` -> `10 min 50 s`."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def run_time_markdown(record: Mapping[str, Any] | None) -> list[str]:
    """The one statement of how long the default's whole `dvc repro` takes."""
    if record is None:
        said = f"The default's run time is not recorded: time `dvc repro`, then `{RECORD_TIME}`."
    else:
        note = f" ({record['note']})" if record.get("note") else ""
        said = (
            f"**Run time.** The default's whole `dvc repro` took {duration(record['seconds'])} "
            f"on a {record['cores']}-core CPU{note}, as `time dvc repro` measured it "
            f"(`docs/run-time.json`, recorded by `{RECORD_TIME}`)."
        )
    return [said, ""]


# What other CPUs write under each `cpu_kernels` choice (docs/concepts.md says what was verified)
ELSEWHERE = {
    "portable": "other x86-64 CPU families write the same bytes",
    "avx2": "torch's and oneDNN's kernels are capped at AVX2 on every CPU, but MKL's matrix "
    "products follow AMD's own pick on AMD CPUs and the AVX2 branch on Intel ones, so {other} "
    "CPU writes other bytes",
    "native": "only the same CPU model writes the same bytes",
}


def cpu_markdown(signature: Mapping[str, str] | None) -> list[str]:
    """Which CPU made the committed outputs, and what a run on another one should expect."""
    if signature is None:
        return []
    kernels = signature.get("kernels", "native")
    other = "an AMD" if signature.get("vendor") == "GenuineIntel" else "an Intel"
    return [
        f"**Made on** {signature['model']} (`cpu_kernels: {kernels}`, torch {signature['torch']}; "
        f"`docs/committed-cpu.json`): {ELSEWHERE[kernels].format(other=other)} (docs/concepts.md, "
        "reproducibility guarantees). Where a run's bytes differ, training compounds the "
        "difference from the first step into other numbers, as another seed would: `rlhf "
        "reproduced` checks that each headline number lies within the seed spread below. CI runs "
        "the same check and says whether the bytes matched.",
        "",
    ]


def spread_cell(compared: Compared, key: str) -> str:
    spread = compared["spread"].get(key)
    if spread is None:
        return "–"
    return (
        f"{number(spread['mean'])} ± {number(spread['std'])} "
        f"({number(spread['low'])} – {number(spread['high'])})"
    )


def seeds_markdown(compared: Compared) -> list[str]:
    """The default's spread over seeds, with how it was measured."""
    seeds = sorted(compared["seeds"], key=int)
    return [
        f"**Over {len(seeds)} seeds** of the default ({', '.join(seeds)}; `rlhf seeds`, then "
        "`rlhf compare --json > docs/seeds.json`): mean ± standard deviation (min – max). A "
        "difference smaller than about two standard deviations is seed noise. Win rates by "
        f"the {JUDGE} judge, ties half.",
        "",
        *seeds_table(compared),
    ]


def seeds_table(compared: Compared) -> list[str]:
    """The spread over seeds of the numbers a reader compares, a row per measure and a column
    per policy: the win rates over SFT's baselines, gold scores and KL to SFT;
    then the reward model's gold accuracy. A measure no seed has is left out."""
    keys = compared["spread"]
    policies = sorted({policy for key in keys if (policy := policy_of(key))})
    rows = [(c.label, [compared_key(p, c.metric) for p in policies]) for c in COMPARISONS] + [
        (ROW_LABELS.get(m, m), [compared_key(p, m) for p in policies]) for m in MEASURES
    ]
    shown = [
        [label, *(spread_cell(compared, key) for key in row_keys)]
        for label, row_keys in rows
        if any(key in keys for key in row_keys)
    ]
    accuracy = f"`{RM_TARGET.key}`, {spread_cell(compared, RM_TARGET.key)}"
    return [
        *markdown_table(["number", *policies], shown),
        f"The reward model's gold accuracy, {accuracy}.",
        "",
    ]


def target_row(target: Target, compared: Compared, ceilings: Mapping[str, float]) -> list[str]:
    """One target's row: what it asks, the mean and range over the seeds, whether it is met,
    and the most a perfect policy would reach in the committed run."""
    says = f"{target.says}: `{target.key}` ≥ {target.threshold:.2f}"
    ceiling = ceilings.get(target.ceiling or "")
    most = "–" if ceiling is None else number(ceiling)
    spread = compared["spread"].get(target.key)
    if spread is None:
        return [says, "not measured", "–", "–", most]
    met = "yes" if spread["mean"] >= target.threshold else "no"
    span = f"{number(spread['low'])} – {number(spread['high'])}"
    return [says, number(spread["mean"]), span, met, most]


def targets_markdown(compared: Compared, evaluation: Metrics) -> list[str]:
    """Issue 45's targets against the mean over the seeds, and each win rate's ceiling."""
    ceilings = evaluation.get("ceiling", {}).get(JUDGE, {})
    rows = [target_row(target, compared, ceilings) for target in targets()]
    header = ["target", "mean over seeds", "min – max", "met", "a perfect policy's (committed run)"]
    return [
        "**Targets** (issue 45), each met when its mean over the seeds reaches it. "
        "docs/seeds.json holds each seed's value, not its interval: the committed run's "
        "intervals are below. The last column is the ceiling: the win rate answers with the "
        "gold judge's full marks on every prompt would reach against the same SFT answers "
        "(`ceiling` in metrics/details/eval.json). Where SFT's answer has full marks too it "
        "is a tie, so no policy can win more.",
        "",
        *markdown_table(header, rows),
        *ceiling_claim(ceilings),
    ]


def ceiling_claim(ceilings: Mapping[str, float]) -> list[str]:
    """What the win-rate targets ask of a policy, as a share of what a perfect one would gain
    over a tie with SFT (0.5) in the committed run."""
    asks = []
    for _, threshold, _, kind in TARGETS_PER_POLICY:
        if kind not in ceilings:
            continue
        ceiling = ceilings[kind]
        perfect = 2 * (1 - ceiling)  # SFT's answers with full marks: each a tie at best
        share = (threshold - 0.5) / (ceiling - 0.5) if ceiling > 0.5 else float("inf")
        asks.append(
            f"against SFT {ANSWERS_OF_SFT[kind]}, SFT's answers "
            f"have full marks on {perfect:.0%} of held-out prompts, so {threshold:.2f} asks for "
            f"{share:.0%} of what a perfect policy would gain there"
        )
    if not asks:
        return []
    return [f"**What the win-rate targets ask** (committed run): {'; '.join(asks)}.", ""]


def seeds_claim(comparison: Comparison, compared: Compared, policies: Sequence[str]) -> str:
    """Each policy's win rate at every seed (docs/seeds.json has no intervals): whose is above
    0.5 at each seed, whose is not, and the highest mean."""
    seeds = sorted(compared["seeds"], key=int)
    values = {p: seed_values(compared, compared_key(p, comparison.metric)) for p in policies}
    measured = {p: list(v.values()) for p, v in values.items() if seeds and len(v) == len(seeds)}
    if not measured:
        return ""
    shown = {p: f"{name(p)} ({', '.join(number(x) for x in v)})" for p, v in measured.items()}
    every = [shown[p] for p, v in measured.items() if min(v) > 0.5]
    text = f"At seeds {', '.join(seeds)}, above 0.5 at each: {listed(every)}"
    if len(every) < len(measured):
        text += f"; not: {listed([shown[p] for p, v in measured.items() if min(v) <= 0.5])}"
    means = {p: statistics.fmean(v) for p, v in measured.items()}
    if len(means) > 1:
        best = max(means, key=means.__getitem__)
        text += f". Highest mean over the seeds: {name(best)} ({number(means[best])})"
    return text + "."


def interval_claim(
    comparison: Comparison, evaluation: Metrics, seed: int, policies: Sequence[str]
) -> str:
    """Which policies win in the committed run with the whole 95% interval above 0.5, which
    do not; a win rate measured without an interval is given as it is."""
    above, not_above, bare = [], [], []
    for p in policies:
        rate = lookup(evaluation, comparison.key(p))
        interval = lookup(evaluation, comparison.interval_key(p)) or {}
        if rate is None:
            continue
        if interval.get("low") is None or interval.get("high") is None:
            bare.append(f"{name(p)} {number(rate)}")
            continue
        shown = f"{name(p)} {number(rate)} ({number(interval['low'])} – {number(interval['high'])})"
        (above if interval["low"] > 0.5 else not_above).append(shown)
    sentences = []
    if above or not_above:
        run = f"the committed run (seed {seed})"
        text = f"Wins with the whole 95% interval above 0.5 in {run}: {listed(above)}"
        sentences.append(text + (f"; not: {listed(not_above)}." if not_above else "."))
    if bare:
        sentences.append(f"In the committed run (seed {seed}), no interval: {listed(bare)}.")
    return " ".join(sentences)


def judge_claim(evaluation: Metrics, policies: Sequence[str]) -> str:
    """The reward model as a judge against the gold judge, on the committed run."""
    pairs = [
        (p, lookup(evaluation, SAMPLED.key(p, REWARD_MODEL)), lookup(evaluation, SAMPLED.key(p)))
        for p in policies
    ]
    pairs = [(p, rm, gold) for p, rm, gold in pairs if rm is not None and gold is not None]
    if not pairs:
        return ""
    shown = listed(
        [f"{name(p)} {number(rm)} where gold says {number(gold)}" for p, rm, gold in pairs]
    )
    proxy = "on your own data it is the judge there is, so read it as the proxy it is"
    if all(rm > gold for _, rm, gold in pairs):
        return (
            "**The reward model as a judge** puts every policy further above SFT than the gold "
            f"judge does ({shown}, sampled, committed run): it flatters the policies that "
            f"optimized it; {proxy}."
        )
    return f"**The reward model as a judge**, sampled, committed run: {shown}; {proxy}."


def claims_markdown(compared: Compared, evaluation: Metrics, seed: int) -> list[str]:
    """What the numbers say, as sentences generated from them: per comparison with SFT's
    baselines, who wins at every seed and who with the whole committed interval above 0.5 (a
    comparison measured nowhere is left out); what the reward model says as a judge; whose KL
    varies most between seeds."""
    policies = [p for p in evaluation["kl_to_sft"] if p != SFT]
    bullets = []
    for comparison in COMPARISONS:
        seeds = seeds_claim(comparison, compared, policies)
        said = " ".join(
            filter(None, (seeds, interval_claim(comparison, evaluation, seed, policies)))
        )
        if said:
            bullets.append(f"**{comparison.title}.** {said}")
    bullets.append(judge_claim(evaluation, policies))
    kl = {p: compared["spread"].get(compared_key(p, "kl_to_sft")) for p in policies}
    kl = {p: s for p, s in kl.items() if s is not None and s["std"] > 0}
    if kl:
        widest = max(kl, key=lambda p: kl[p]["std"])
        bullets.append(
            f"**KL to SFT** varies most between seeds for {name(widest)}: "
            f"{number(kl[widest]['low'])} to {number(kl[widest]['high'])} nats per answer."
        )
    return [
        "**What the numbers say**, generated from them (win rates by the gold judge, ties half):",
        "",
        *(f"- {bullet}" for bullet in bullets if bullet),
        "",
    ]


def committed_markdown(evaluation: Metrics, reward_model: Metrics, seed: int) -> list[str]:
    """The committed run in full: every policy's measures and every pair's win rates."""
    return [
        f"**The committed run** (`dvc repro`, seed {seed}) on {evaluation['prompts']} held-out "
        "prompts; the reward model orders "
        f"{reward_model['acc_gold']:.1%} of held-out comparisons as the gold judge does.",
        "",
        *policies_table(evaluation),
        f"Win rates judged by {JUDGE}, ties half, 95% bootstrap over prompts:",
        "",
        *win_rates_table(evaluation, JUDGE),
    ]


def results_markdown(
    evaluation: Metrics,
    reward_model: Metrics,
    seed: int,
    compared: Compared | None,
    run_time: Mapping[str, Any] | None,
    committed_cpu: Mapping[str, str] | None = None,
) -> str:
    """The `results` block: the run time, the seeds' spread, the targets, the claims, the
    committed run. Without docs/seeds.json, the run time, claims and committed run alone."""
    seeds = compared or {"seeds": {}, "spread": {}}
    lines = [
        *run_time_markdown(run_time),
        *cpu_markdown(committed_cpu),
        *(seeds_markdown(seeds) + targets_markdown(seeds, evaluation) if compared else []),
        *claims_markdown(seeds, evaluation, seed),
        *committed_markdown(evaluation, reward_model, seed),
    ]
    return "\n".join(lines).rstrip("\n")


def task_changes(evaluation: Metrics, policy: str) -> str:
    """Where `policy`'s sampled gold score moved from SFT's by at least GOLD_DROP, by task."""
    by_task = evaluation["by_task"]
    moved: dict[str, list[str]] = {"gains": [], "loses": [], "is level": []}
    for task, scores in by_task[SFT].items():
        before, after = scores["gold_sampled"], by_task[policy][task]["gold_sampled"]
        way = "is level"
        if abs(after - before) >= GOLD_DROP:
            way = "gains" if after > before else "loses"
        moved[way].append(f"{task} ({number(before)} → {number(after)})")
    said = [f"{way} on {listed(tasks)}" for way, tasks in moved.items() if tasks]
    return f"{name(policy)} {'; '.join(said)}"


def curve_claim(rows: Sequence[Mapping[str, str]]) -> str:
    """Each RL policy's gold score along training: SFT's, the peak, the end."""
    by_policy: dict[str, list[Mapping[str, str]]] = {}
    for row in rows:
        if row.get("gold_score"):
            by_policy.setdefault(row["policy"], []).append(row)
    said = []
    for policy, curve in by_policy.items():
        gold = [float(row["gold_score"]) for row in curve]
        peak = max(range(len(curve)), key=gold.__getitem__)
        said.append(
            f"{name(policy)}'s gold score goes from SFT's {number(gold[0])} to its peak, "
            f"{number(gold[peak])}, at iteration {curve[peak]['step']} (KL "
            f"{number(float(curve[peak]['kl_to_sft']))}) and ends at {number(gold[-1])}"
        )
    if not said:
        return ""
    return (
        f"Along RL training (`{paths.EVAL_CURVE.as_posix()}`, fewer answers per prompt at the "
        f"snapshots): {'; '.join(said)}."
    )


def findings_markdown(
    evaluation: Metrics, reward_model: Metrics, curve: Sequence[Mapping[str, str]]
) -> str:
    """The `findings` block: the committed run's gold score by task family with the reward
    model's gold accuracy there, where each policy gains on SFT, the task the reward model
    judges worst, and the gold score along RL training."""
    policies = list(evaluation["kl_to_sft"])
    by_task, accuracy = evaluation["by_task"], reward_model.get("acc_gold_by_task", {})
    rows = [
        [task, *(number(by_task[p][task]["gold_sampled"]) for p in policies),
         number(accuracy[task]) if task in accuracy else "–"]
        for task in by_task[SFT]
    ]  # fmt: skip
    lines = [
        "The committed run by task family: the gold score of sampled answers, and how often the "
        "reward model orders that family's held-out comparisons as the gold judge does.",
        "",
        *markdown_table(["task", *policies, "reward model's gold accuracy"], rows),
        "Against SFT, by at least "
        f"{GOLD_DROP}: {'. '.join(task_changes(evaluation, p) for p in policies if p != SFT)}.",
    ]
    if accuracy:
        worst = min(accuracy, key=accuracy.get)
        lines.append(
            f"The reward model judges {worst} worst (gold accuracy {number(accuracy[worst])}, "
            f"{number(reward_model['acc_gold'])} over all families)."
        )
    lines.append(curve_claim(curve))
    lines.append("")
    for name, caption in FIGURES.items():
        lines += [
            f"**{caption}** (`reports/figures/{name}`)",
            "",
            f"![{caption}](figures/{name})",
            "",
        ]
    return "\n".join(lines).rstrip("\n")


def stale_figures() -> list[str]:
    """The results page's figures that are not the committed report's."""
    stale = []
    for name in FIGURES:
        copy = FIGURE_FOLDER / name
        if not copy.is_file() or copy.read_bytes() != (REPORT_FIGURES / name).read_bytes():
            stale.append(f"docs/figures/{name}")
    return stale


def with_block(text: str, block_name: str, block: str, page: str) -> str:
    """`text` with the named block between its markers replaced by `block`."""
    begin, end = f"<!-- {block_name}:begin -->", f"<!-- {block_name}:end -->"
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"{page}: needs one {begin} and one {end} line")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def record_time(seconds: float) -> None:
    """docs/run-time.json: the default's whole `dvc repro`, timed on this machine."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    record = {"seconds": round(seconds), "cores": cores}
    RUN_TIME.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{RUN_TIME.relative_to(ROOT)}: {duration(seconds)} on {cores} cores")


def stale_seeds(compared: Compared, seed: int) -> bool:
    """Whether docs/seeds.json's run at the committed seed is not the committed one: compared
    as `rlhf compare` reads runs, from the headline files alone."""
    _, headline = read_run(lambda path: (ROOT / path).read_text())
    return compared["seeds"].get(str(seed)) != compared_numbers(headline)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report a stale block")
    parser.add_argument(
        "--record-time",
        type=float,
        metavar="SECONDS",
        help="record how long the default's whole `dvc repro` took, then regenerate",
    )
    args = parser.parse_args(argv)
    if args.record_time is not None:
        record_time(args.record_time)
    for stage in ("eval", "rm"):  # DVC-cached: a checkout without them cannot say anything
        if not (ROOT / paths.details_file(stage)).exists():
            print(f"{paths.details_file(stage)} is missing: run `dvc pull` (or `dvc repro`)")
            return 1
    evaluation, reward_model = read_metrics("eval", ROOT), read_metrics("rm", ROOT)
    seed = yaml.safe_load((ROOT / "params.yaml").read_text())["seed"]
    compared = read_json(SEEDS)
    if compared is not None and stale_seeds(compared, seed):
        print(f"{SEEDS.name}: its run at seed {seed} is not the one in metrics/: rerun "
              "`rlhf seeds` and `rlhf compare --json > docs/seeds.json`")  # fmt: skip
        return 1
    with (ROOT / paths.EVAL_CURVE).open() as file:
        curve = list(csv.DictReader(file))
    blocks = {
        "results": results_markdown(
            evaluation, reward_model, seed, compared, read_json(RUN_TIME), read_json(COMMITTED_CPU)
        ),
        "findings": findings_markdown(evaluation, reward_model, curve),
    }
    stale = []
    for page in (README, RESULTS_PAGE):
        text = page.read_text()
        updated = text
        for block_name, pages in BLOCKS.items():
            if page in pages:
                updated = with_block(updated, block_name, blocks[block_name], page.name)
        if updated != text:
            stale.append(page.name)
            if not args.check:
                page.write_text(updated)
    figures = stale_figures()
    if figures and not args.check:
        FIGURE_FOLDER.mkdir(exist_ok=True)
        for name in FIGURES:
            shutil.copyfile(REPORT_FIGURES / name, FIGURE_FOLDER / name)
    stale += figures
    if args.check and stale:
        print(f"{', '.join(stale)}: the results differ from metrics/: run python docs/results.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
