"""The README stays a short guide and the docs stay true to the code: the generated references
match the Typer app and the params schema, the results tables, targets and claims say what the
metrics they are given say, and no relative link points at nothing. (MkDocs's own `--strict`
build, anchors included, runs in the README's test command, not here; that the committed
results pages are those of the committed metrics, in tests/unit/test_default_run.py.)"""

import importlib.util
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", flags=re.M | re.S)
CODE_SPAN = re.compile(r"`[^`]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
EXTERNAL = ("http://", "https://", "mailto:", "#")


def test_generated_references_are_up_to_date():
    """The CLI and params references from the code."""
    result = subprocess.run(
        [sys.executable, "docs/generate.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_is_at_most_300_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


def relative_links(page: Path) -> list[str]:
    """The targets of a page's Markdown links that are files of this repository: code blocks
    and spans are left out, since `[x](y)` there is code, not a link."""
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    return [target for target in LINK.findall(text) if not target.startswith(EXTERNAL)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_point_at_files(page):
    missing = [
        target
        for target in relative_links(page)
        if not (page.parent / target.split("#")[0]).exists()
    ]
    assert missing == [], f"{page.relative_to(REPO)} links to files that do not exist"


def load_docs_script(name: str):
    """docs/NAME.py as a module (registered first: its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(f"docs_{name}", REPO / "docs" / f"{name}.py")
    script = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


results = load_docs_script("results")


def compared_runs(runs: dict[str, dict[str, float]]) -> dict:
    """`rlhf compare --json` of these runs (seed -> numbers): each number every seed has."""
    shared = set.intersection(*(set(numbers) for numbers in runs.values()))
    spread = {}
    for key in sorted(shared):
        values = [numbers[key] for numbers in runs.values()]
        spread[key] = {
            "mean": statistics.fmean(values), "std": statistics.stdev(values),
            "low": min(values), "high": max(values), "seeds": len(values),
        }  # fmt: skip
    return {"seeds": runs, "spread": spread}


def seed_numbers(ppo_best: float, dpo_best: float, greedy: float, acc: float) -> dict:
    """One seed of the new evaluation: GRPO's baselines left unmeasured."""
    return {
        "eval/ppo:win": 0.58, "eval/dpo:win": 0.57, "eval/grpo:win": 0.55,
        "eval/ppo:win_t": ppo_best, "eval/dpo:win_t": dpo_best,
        "eval/ppo:win_greedy": greedy, "eval/dpo:win_greedy": greedy - 0.1,
        "eval/ppo:win_bon": 0.52, "eval/dpo:win_bon": 0.45,
        "eval/sft:gold": 0.6, "eval/ppo:gold": 0.7,
        "eval/sft:gold_greedy": 0.8, "eval/ppo:gold_greedy": 0.82,
        "eval/sft:kl": 0.0, "eval/ppo:kl": 0.8 + 10 * (acc - 0.9), "eval/dpo:kl": 0.4,
        "eval/grpo:kl": 0.9, "rm:acc": acc,
    }  # fmt: skip


NEW_SEEDS = compared_runs(
    {
        "1": seed_numbers(0.61, 0.62, 0.56, 0.92),
        "2": seed_numbers(0.63, 0.48, 0.58, 0.90),
        "1234": seed_numbers(0.62, 0.64, 0.57, 0.91),
    }
)
OLD_KEYS = (":win", ":gold", ":kl", "rm:acc")
OLD_SEEDS = compared_runs(  # what `rlhf compare` compared before the baselines were measured
    {
        seed: {k: v for k, v in seed_numbers(0.6, 0.6, 0.6, acc).items() if k.endswith(OLD_KEYS)}
        for seed, acc in (("1", 0.85), ("2", 0.88))
    }
)


def interval(low: float, high: float) -> dict[str, float]:
    return {"low": low, "high": high}


EVALUATION = {  # the committed run of the new evaluation, seed 1234
    "prompts": 200,
    "kl_to_sft": {"dpo": 0.4, "grpo": 0.9, "ppo": 0.8, "sft": 0.0},
    "win_rate": {
        "gold": {"dpo_vs_sft": 0.57, "grpo_vs_sft": 0.55, "ppo_vs_sft": 0.58},
        "rm": {"dpo_vs_sft": 0.6, "grpo_vs_sft": 0.65, "ppo_vs_sft": 0.62},
    },
    "win_rate_ci95": {"gold": {"dpo_vs_sft": interval(0.55, 0.59),
                               "grpo_vs_sft": interval(0.53, 0.57),
                               "ppo_vs_sft": interval(0.56, 0.6)}},
    "win_rate_best_temperature": {"gold": {"dpo_vs_sft": 0.64, "ppo_vs_sft": 0.62}},
    "win_rate_best_temperature_ci95": {"gold": {"dpo_vs_sft": interval(0.6, 0.68),
                                                "ppo_vs_sft": interval(0.49, 0.7)}},
    "win_rate_greedy": {"gold": {"dpo_vs_sft": 0.47, "grpo_vs_sft": 0.5, "ppo_vs_sft": 0.57}},
    "gold_sampled": {"dpo": 0.7, "grpo": 0.68, "ppo": 0.71, "sft": 0.62},
    "by_task": {
        "sft": {"add": {"gold_sampled": 0.47}, "greet": {"gold_sampled": 0.58}},
        "dpo": {"add": {"gold_sampled": 0.4}, "greet": {"gold_sampled": 0.7}},
        "grpo": {"add": {"gold_sampled": 0.48}, "greet": {"gold_sampled": 0.6}},
        "ppo": {"add": {"gold_sampled": 0.46}, "greet": {"gold_sampled": 0.7}},
    },
}  # fmt: skip
EVALUATION |= {  # what the committed tables need besides
    "win_rate_decisive": EVALUATION["win_rate"],
    "win_rate_decisive_ci95": EVALUATION["win_rate_ci95"],
    "tie_rate": {"gold": {pair: 0.5 for pair in EVALUATION["win_rate"]["gold"]}},
}


def row(lines: list[str], starts: str) -> list[str]:
    """The cells of the Markdown table row whose first cell starts with `starts`."""
    (line,) = [line for line in lines if line.startswith(f"| {starts}")]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_targets_are_met_by_the_mean_over_the_seeds_or_not_measured():
    """Each target met or not by the mean over the seeds, beside its ceiling: the win rate a
    perfect policy would reach against the same SFT answers in the committed run."""
    ceilings = {"best_temperature": 0.6, "greedy": 0.625}
    lines = results.targets_markdown(NEW_SEEDS, {**EVALUATION, "ceiling": {"gold": ceilings}})
    assert row(lines, "PPO at its best temperature")[1:] == [
        "0.620", "0.610 – 0.630", "yes", "0.600"
    ]  # fmt: skip
    assert row(lines, "DPO at its best temperature")[1:] == [
        "0.580",
        "0.480 – 0.640",
        "no",
        "0.600",
    ]
    assert row(lines, "PPO greedy")[1:] == ["0.570", "0.560 – 0.580", "yes", "0.625"]
    assert row(lines, "DPO greedy")[3] == "no"
    assert row(lines, "PPO's gold score")[3:] == ["yes", "–"]
    assert row(lines, "DPO's gold")[3] == "no"
    for target in ("GRPO at its best", "GRPO greedy", "GRPO's gold score"):
        assert row(lines, target)[1:4] == ["not measured", "–", "–"]
    assert row(lines, "The reward model")[1:] == ["0.910", "0.900 – 0.920", "yes", "–"]
    assert row(results.targets_markdown(OLD_SEEDS, EVALUATION), "The reward model")[3] == "no"
    assert lines[-2] == (
        "**What the win-rate targets ask** (committed run): against SFT at its best "
        "temperature, SFT's answers have full marks on 80% of held-out prompts, so 0.60 asks "
        "for 100% of what a perfect policy would gain there; against SFT greedy, SFT's answers "
        "have full marks on 75% of held-out prompts, so 0.55 asks for 40% of what a perfect "
        "policy would gain there."
    )


def test_claims_say_who_wins_at_every_seed_and_with_the_whole_committed_interval():
    policies = ["dpo", "grpo", "ppo"]
    assert results.seeds_claim(results.BEST_TEMPERATURE, NEW_SEEDS, policies) == (
        "At seeds 1, 2, 1234, above 0.5 at each: PPO (0.610, 0.630, 0.620); not: DPO (0.620, "
        "0.480, 0.640). Highest mean over the seeds: PPO (0.620)."
    )
    assert results.interval_claim(results.BEST_TEMPERATURE, EVALUATION, 1234, policies) == (
        "Wins with the whole 95% interval above 0.5 in the committed run (seed 1234): DPO 0.640 "
        "(0.600 – 0.680); not: PPO 0.620 (0.490 – 0.700)."
    )
    assert results.interval_claim(results.GREEDY, EVALUATION, 1234, policies) == (
        "In the committed run (seed 1234), no interval: DPO 0.470, GRPO 0.500, PPO 0.570."
    )
    claims = "\n".join(results.claims_markdown(NEW_SEEDS, EVALUATION, 1234))
    sampled = "- **Sampled, against SFT sampled.** At seeds 1, 2, 1234, above 0.5 at each: DPO"
    assert f"{sampled} (0.570, 0.570, 0.570), GRPO (0.550, 0.550, 0.550), PPO" in claims
    assert "(seed 1234): DPO 0.570 (0.550 – 0.590), GRPO 0.550 (0.530 – 0.570), PPO" in claims
    assert "puts every policy further above SFT than the gold judge does" in claims
    best_of_n = "Against best-of-n of SFT at the nearest KL.** At seeds 1, 2, 1234, above 0.5"
    assert f"{best_of_n} at each: PPO (0.520, 0.520, 0.520); not: DPO (0.450, 0.450" in claims
    assert "**KL to SFT** varies most between seeds for PPO: 0.800 to 1.000 nats" in claims
    same_kl = {"seeds": {}, "spread": {"eval/ppo:kl": {"std": 0.0}}}
    assert "KL to SFT" not in "".join(results.claims_markdown(same_kl, EVALUATION, 1234))


def test_old_seeds_and_metrics_without_the_new_numbers_still_generate():
    """docs/seeds.json and metrics/ from before the baselines were measured: the new rows are
    left out or not measured, nothing is guessed."""
    old = {k: v for k, v in EVALUATION.items() if not k.startswith("win_rate_best")}
    block = results.results_markdown(old, {"acc_gold": 0.85}, 1234, OLD_SEEDS, None)
    assert "run time is not recorded" in block and "--record-time SECONDS" in block
    seeds_table = block.split("**Targets**")[0]
    assert "| win rate over SFT, sampled |" in seeds_table
    assert "greedy" not in seeds_table and "best temperature" not in seeds_table
    assert block.count("| not measured |") == len(results.TARGET_POLICIES) * 3
    assert "Each at its best temperature, against" not in block
    assert "**Greedy, against SFT greedy.** In the committed run (seed 1234), no interval" in block
    assert results.results_markdown(old, {"acc_gold": 0.85}, 1234, None, None).count("|") > 0


def test_the_run_time_is_stated_from_its_record():
    said = results.run_time_markdown({"seconds": 650, "cores": 2})[0]
    assert "`dvc repro` took 10 min 50 s on a 2-core CPU, as `time dvc repro` measured" in said
    assert results.duration(59.6) == "1 min 0 s" and results.duration(42) == "42 s"


def test_findings_by_task_and_along_training():
    columns = ("policy", "step", "kl_to_sft", "rm_score", "gold_score")
    curve = [  # metrics/eval_overoptimization.csv as csv.DictReader reads it
        dict(zip(columns, row, strict=True))
        for row in (("ppo", "0", "0.0", "-0.3", "0.62"), ("ppo", "20", "0.5", "-0.1", "0.7"),
                    ("ppo", "80", "0.8", "0.0", "0.69"))
    ]  # fmt: skip
    reward_model = {"acc_gold": 0.82, "acc_gold_by_task": {"add": 0.6, "greet": 0.85}}
    block = results.findings_markdown(EVALUATION, reward_model, curve)
    assert row(block.splitlines(), "add") == ["add", "0.400", "0.480", "0.460", "0.470", "0.600"]
    assert "PPO gains on greet (0.580 → 0.700); is level on add (0.470 → 0.460)" in block
    assert "DPO gains on greet (0.580 → 0.700); loses on add (0.470 → 0.400)" in block
    assert "judges add worst (gold accuracy 0.600, 0.820 over all families)" in block
    peak = "from SFT's 0.620 to its peak, 0.700, at iteration 20 (KL 0.500) and ends at 0.690."
    assert f"PPO's gold score goes {peak}" in block


verifiable = load_docs_script("verifiable")


def checked_run(sft: float, grpo: float) -> dict:
    """One seed's checker numbers, as docs/verifiable.py records them."""
    accuracy = {"sft": sft, "grpo": grpo}
    return {
        "accuracy": accuracy,
        "accuracy_ci95": {p: {"low": a - 0.05, "high": a + 0.05} for p, a in accuracy.items()},
        "accuracy_greedy": accuracy,
        "pass_at_k": {p: {"1": a, "2": min(1.0, 2 * a)} for p, a in accuracy.items()},
    }


def test_the_verifiable_block_says_whether_grpo_beats_sft_at_every_seed():
    text = verifiable.block({"1": checked_run(0.5, 0.6), "2": checked_run(0.4, 0.45)})
    lines = text.splitlines()
    assert row(lines, "grpo") == [
        "grpo", "0.525 ± 0.106", "0.600 (0.550 – 0.650)", "0.450 (0.400 – 0.500)",
        "0.525 ± 0.106", "0.525 ± 0.106", "0.950 ± 0.071",
    ]  # fmt: skip
    assert lines[-1].startswith("GRPO rewarded by the checker raises held-out accuracy above")
    assert "+0.100 (seed 1), +0.050 (seed 2)" in lines[-1]
    text = verifiable.block({"1": checked_run(0.5, 0.6), "2": checked_run(0.4, 0.35)})
    assert "does not raise held-out accuracy above SFT's at every seed" in text
    timed = verifiable.block({"1": checked_run(0.5, 0.6) | {"seconds": 441}})
    assert timed.endswith("7 min 21 s (seed 1); the other seeds' runs shared the CPU and are not "
                          "timed.")  # fmt: skip


def test_the_variants_block_sets_each_grpo_variant_beside_the_others_at_its_seeds():
    def variant(accuracy: float, kl: float) -> dict:
        grpo = {key: value["grpo"] for key, value in checked_run(0.5, accuracy).items()}
        return grpo | {"kl": kl}

    text = verifiable.variants_block({
        "example": {"settings": [], "seeds": {"1": variant(0.8, 0.2), "2": variant(0.9, 0.4)}},
        "Dr. GRPO": {"settings": ["grpo.std_normalize=false"], "seeds": {"1": variant(0.7, 0.1)}},
    }, {"1": checked_run(0.5, 0.8), "2": checked_run(0.5, 0.9)})  # fmt: skip
    lines = text.splitlines()
    assert lines[0] == (
        "| GRPO | settings | accuracy, sampled | seed 1: accuracy (95% interval) | seed 2: "
        "accuracy (95% interval) | accuracy, greedy | pass@2 | KL to SFT |"
    )
    assert row(lines, "example") == [
        "example", "the file's", "0.850 ± 0.071", "0.800 (0.750 – 0.850)",
        "0.900 (0.850 – 0.950)", "0.850 ± 0.071", "1.000 ± 0.000", "0.300 ± 0.141",
    ]  # fmt: skip
    assert row(lines, "Dr. GRPO")[1:5] == [
        "`grpo.std_normalize=false`", "0.700", "0.700 (0.650 – 0.750)", "–",
    ]  # fmt: skip
    assert lines[-1] == (
        "- Dr. GRPO against the example's GRPO at the same seed: -0.100 (seed 1); not above it "
        "at every one."
    )


def test_the_verifiable_block_is_the_recorded_seeds():
    assert verifiable.main(["--check"]) == 0


examples = load_docs_script("examples")


def example_run(numbers: dict, low: float) -> dict:
    """One seed of an example as docs/examples.py records it: every decoding win rate's
    interval from `low` to 0.7."""
    intervals = {k: interval(low, 0.7) for k in numbers if k.endswith(("win_t", "greedy", "bon"))}
    return {"rev": "r", "numbers": numbers, "intervals": intervals,
            "ceilings": {"best_temperature": 0.8, "greedy": 0.75}}  # fmt: skip


EXAMPLE_RUNS = {  # PPO's win_t 0.61, 0.63, 0.62; DPO's 0.62, 0.48, 0.64; rm:acc 0.92, 0.90, 0.91
    seed: example_run(NEW_SEEDS["seeds"][seed], low)
    for seed, low in (("1", 0.52), ("2", 0.49), ("1234", 0.55))
}


def test_an_examples_targets_are_met_on_the_mean_and_at_every_seed_beside_the_default():
    lines = examples.example_block("rm-budget", EXAMPLE_RUNS, OLD_SEEDS).splitlines()
    changed = "(`collect.k=8`, `data.n_prompts=12000` against the default; seeds 1, 2, 1234"
    assert changed in lines[0]
    assert lines[0].endswith("ties half.")  # no run timed alone
    assert row(lines, "PPO at its best temperature")[1:] == ["0.620", "0.610", "yes", "yes", "–"]
    assert row(lines, "DPO at its best temperature")[1:] == ["0.580", "0.480", "no", "no", "–"]
    assert row(lines, "The reward model")[1:] == ["0.910", "0.900", "yes", "yes", "0.865"]
    assert not any(line.startswith("| GRPO") for line in lines)  # GRPO's baselines unmeasured
    best_t = next(line for line in lines if line.startswith("- **Each at its best temperature"))
    assert "PPO 0.610 (0.520 – 0.700) at seed 1, 0.630 (0.490 – 0.700) at seed 2" in best_t
    assert best_t.endswith("Whole interval above 0.5 at every seed: none.")
    assert lines[-1] == (
        "A perfect policy would win 0.800 against SFT at its best temperature; 0.750 against SFT "
        "greedy (the ceilings)."
    )


def test_the_readme_line_of_an_example_groups_its_targets_by_how_they_are_met():
    timed = {**EXAMPLE_RUNS, "1234": EXAMPLE_RUNS["1234"] | {"seconds": 885}}
    (line,) = examples.readme_block({"rm-budget": timed}).splitlines()
    assert "met at every seed: PPO `win_t` 0.620, PPO `win_greedy` 0.570" in line
    assert "PPO `win_bon` 0.520, `rm:acc` 0.910; not met: DPO `win_t` 0.580" in line
    assert line.endswith("Each whole run, alone on a 2-core CPU: 14 min 45 s (seed 1234).")


def locked(reward_model: str, evaluated_on: str, seed: int) -> str:
    """A dvc.lock of two stages: the reward model, as the evaluation read it, each at `seed`."""
    model = "artifacts/rm/model.pt"
    return json.dumps({"schema": "2.0", "stages": {
        "rm": {"params": {"params.yaml": {"seed": seed, "data.n_prompts": 12000}},
               "outs": [{"path": model, "md5": reward_model}]},
        "evaluate": {"params": {"params.yaml": {"seed": seed}},
                     "deps": [{"path": model, "md5": evaluated_on}]},
    }})  # fmt: skip


def test_a_run_is_recorded_only_if_it_ran_the_whole_example(monkeypatch, tmp_path):
    """A run of the default is refused, naming what differs, and so is a run whose dvc.lock
    says a stage ran on other params or inputs (part of the pipeline rerun); a run of the
    example is recorded under its seed, with its intervals and ceilings, from the files DVC
    reads at its rev."""
    params = (REPO / "examples" / "rm-budget.params.yaml").read_text()
    files = {
        "params.yaml": params.replace("seed: 1234", "seed: 5"),
        "metrics/details/eval.json": json.dumps({
            **EVALUATION, "ceiling": {"gold": {"greedy": 0.75}}
        }),
        **{f"metrics/{name}.json": json.dumps({"win_t": 0.6, "acc": 0.9})
           for name in ("rm", "eval/sft", "eval/ppo", "eval/grpo", "eval/dpo")},
    }  # fmt: skip
    files["dvc.lock"] = locked(reward_model="a", evaluated_on="a", seed=5)
    monkeypatch.setattr(examples, "read_at", lambda rev, path: files[str(path)])
    monkeypatch.setattr(examples, "RECORDED", tmp_path / "recorded.json")
    assert examples.record("rm-budget", "exp-1", seconds=None) == "5"
    (run,) = json.loads((tmp_path / "recorded.json").read_text())["rm-budget"].values()
    assert run["numbers"]["eval/ppo:win_t"] == 0.6 and run["numbers"]["rm:acc"] == 0.9
    assert run["intervals"]["eval/ppo:win_t"] == interval(0.49, 0.7)
    assert run["ceilings"] == {"greedy": 0.75} and run["rev"] == "exp-1"
    files["dvc.lock"] = locked(reward_model="b", evaluated_on="a", seed=5)  # `dvc exp run rm`
    with pytest.raises(SystemExit, match=r"exp-1: its dvc\.lock says evaluate did not run on"):
        examples.record("rm-budget", "exp-1", seconds=None)
    files["dvc.lock"] = locked(reward_model="a", evaluated_on="a", seed=6)
    with pytest.raises(SystemExit, match="says rm, evaluate did not run"):
        examples.record("rm-budget", "exp-1", seconds=None)
    files["params.yaml"] = (REPO / "params.yaml").read_text()
    refused = r"not a run of examples/rm-budget\.params\.yaml: .*n_prompts"
    with pytest.raises(SystemExit, match=refused):
        examples.record("rm-budget", "exp-2", seconds=None)


def test_the_examples_blocks_are_the_recorded_runs():
    assert examples.main(["--check"]) == 0
