"""Verifiable rewards end to end on your own data: a GSM8K-format file of made-up problems
imported, then prepare -> SFT -> collect ranked by the answer checker -> reward model -> GRPO
rewarded by the checker -> DPO -> evaluate judged by it, through `dvc repro` (tiny config);
then GRPO again, rewarded by the checker beside the reward model."""

import json
import subprocess
import sys
from pathlib import Path

import torch

from rlhf.data.schemas import PROMPT_SCHEMA, SFT_SCHEMA, read_rows, write_rows

from conftest import clean_env, init_dvc_repo, make_project, sh, write_params

FIXTURE = Path(__file__).parents[1] / "fixtures" / "gsm8k_tiny.jsonl"  # 48 made-up problems
CHECK = "check:gsm8k"
ANSWER_TOKENS = 16  # `12*4=48\n#### 48`: the final answer must fit
VERIFIABLE = {
    "data.source": "files",
    "data.heldout_fraction": 0.25,
    "sft.epochs": 40,  # 23 training problems, learnt well enough that sampling is sometimes right
    "rl_algorithms": ["grpo"],
    "collect.labeler": CHECK,
    "rl.reward": CHECK,
    "evaluate.judges": [CHECK, "rm"],
    "evaluate.samples": 4,
    "evaluate.bon_n": [2],
    "sft.eval_max_new_tokens": ANSWER_TOKENS,
    "collect.max_new_tokens": ANSWER_TOKENS,
    "rl.max_new_tokens": ANSWER_TOKENS,
    "evaluate.max_new_tokens": ANSWER_TOKENS,
}


def test_gsm8k_file_runs_the_pipeline_with_the_checker_as_labeler_reward_and_judge(tmp_path):
    project = init_dvc_repo(make_project(tmp_path / "p", VERIFIABLE))
    rlhf = str(Path(sys.executable).parent / "rlhf")
    sh([rlhf, "import", str(FIXTURE), "--kind", "gsm8k"], project)
    assert len(read_rows(project / "data/raw/sft.parquet", SFT_SCHEMA)) == 48
    sh(["dvc", "repro"], project)

    prompts = read_rows(project / "data/prepared/prompts_train.parquet", PROMPT_SCHEMA)
    assert all(row["reference"].isdigit() for row in prompts)
    details = json.loads((project / "metrics/details/eval.json").read_text())
    assert "gold_sampled" not in details  # no task suite, no gold judge
    for policy in ("sft", "grpo", "dpo"):
        accuracy = details["accuracy"][CHECK][policy]
        ci = details["accuracy_ci95"][CHECK][policy]
        assert 0 <= ci["low"] <= accuracy <= ci["high"] <= 1
        passes = details["pass_at_k"][CHECK][policy]
        assert list(passes) == ["1", "2", "4"]
        assert passes["1"] == accuracy  # pass@1 is the share of right samples
        assert passes["1"] <= passes["2"] <= passes["4"]
        shown = json.loads((project / f"metrics/eval/{policy}.json").read_text())
        assert shown["acc"] == accuracy
    assert set(details["win_rate"]) == {CHECK, "rm"}
    report = (project / "reports/eval.md").read_text()
    assert f"**Answers checked by `{CHECK}`**, the answer checker" in report
    assert "| policy | accuracy, sampled | 95% interval | accuracy, greedy | pass@1 |" in report
    collected = json.loads((project / "metrics/details/collect.json").read_text())
    assert collected["pairs"] > 0  # right answers ranked above wrong ones

    # the checker in an ensemble beside the reward model, weighted 1 and 0: the very same
    # rewards reach GRPO through the ensemble, and it trains to the same weights
    policy = project / "artifacts/grpo/model.pt"
    trained = torch.load(policy, weights_only=True)["model"]
    ensemble = {
        "rl.reward": "ensemble",
        "rl.ensemble": [CHECK],
        "rl.ensemble_reduce": "weighted_sum",
        "rl.ensemble_weights": [0.0, 1.0],  # the reward model's, then the checker's
    }
    write_params(project, VERIFIABLE | ensemble)
    sh(["dvc", "repro", "rl@grpo"], project)
    retrained = torch.load(policy, weights_only=True)["model"]
    assert trained.keys() == retrained.keys()
    assert all(torch.equal(trained[key], retrained[key]) for key in trained)

    # a held-out prompt without its reference: refused before any model loads, naming the row
    heldout = project / "data/prepared/prompts_heldout.parquet"
    rows = read_rows(heldout, PROMPT_SCHEMA)
    write_rows(heldout, [*rows[:2], {**rows[2], "reference": None}, *rows[3:]], PROMPT_SCHEMA)
    refused = subprocess.run([sys.executable, "-m", "rlhf.stages.evaluate"], cwd=project,
                             env=clean_env(), capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert (
        "data/prepared/prompts_heldout.parquet: row 3: field 'reference': is null, but "
        f"evaluate.judges names '{CHECK}', which checks every answer" in refused.stderr
    )
