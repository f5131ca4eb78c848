"""CI's check of the README's install-and-run (`.ci/outputs.py`) on a checkout of its own: the
bytes on the CPU that made the committed outputs, the seed spread on any other."""

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlhf.cli import app
from rlhf.cpu import cpu_signature
from rlhf.eval.seeds import OTHER_CPU_STDS, read_against
from rlhf.project import reproduction
from rlhf.project.drift import read_baseline

from conftest import REPO

SPREAD = {
    "eval/ppo:win": dict(mean=0.58, std=0.02, low=0.56, high=0.6, seeds=3),
    "rm:acc": dict(mean=0.85, std=0.03, low=0.81, high=0.88, seeds=3),
}
GIT = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.com"]
COMMITTED = {"eval/ppo": {"win": 0.57}, "rm": {"acc": 0.84}}


def write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git checkout holding committed metrics, their seeds' spread and the CPU that made them
    (this one)."""
    write_json(
        tmp_path / "docs/seeds.json", {"seeds": {"1": {}, "2": {}, "3": {}}, "spread": SPREAD}
    )
    write_json(tmp_path / "docs/committed-cpu.json", cpu_signature("avx2"))
    (tmp_path / "params.yaml").write_text("rl_algorithms: [ppo]\n")
    for name, metrics in COMMITTED.items():
        write_json(tmp_path / f"metrics/{name}.json", metrics)
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "outputs"]):
        subprocess.run([*GIT, *args], cwd=tmp_path, check=True)
    return tmp_path


@pytest.fixture
def check(capsys):
    """`python .ci/outputs.py check --root ROOT`: its exit status and what it printed."""
    spec = importlib.util.spec_from_file_location("ci_outputs", REPO / ".ci" / "outputs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def run(root: Path) -> tuple[int, str, str]:
        status = script.main(["check", "--root", str(root)])
        printed = capsys.readouterr()
        return status, printed.out, printed.err

    return run


def rerun(root: Path, win_rate: float) -> None:
    """The README's run wrote this win rate over SFT."""
    write_json(root / "metrics/eval/ppo.json", {"win": win_rate})


ELSEWHERE = "Another Vendor's CPU"  # not this one's, whichever x86-64 CPU runs the tests


def made_elsewhere(root: Path) -> None:
    """The committed outputs come from another CPU."""
    write_json(root / "docs/committed-cpu.json", cpu_signature("avx2") | {"model": ELSEWHERE})
    subprocess.run([*GIT, "commit", "-qam", "elsewhere"], cwd=root, check=True)


def test_the_committed_cpu_checks_bytes(checkout, check):
    status, out, _ = check(checkout)
    assert status == 0 and "outputs check: bytes" in out
    rerun(checkout, 0.5701)  # a last-digit change fails it
    status, _, err = check(checkout)
    assert status == 1 and "changed:  M metrics/eval/ppo.json" in err


def test_another_cpu_checks_the_seed_spread_and_restores_the_committed_files(checkout, check):
    made_elsewhere(checkout)
    rerun(checkout, 0.62)  # within 0.58 ± 4 * 0.02
    status, out, err = check(checkout)
    assert status == 0, err
    assert "outputs check: seed spread" in out and f"model {ELSEWHERE}" in out
    assert "bytes: 1 committed files differ on this CPU (metrics/eval/ppo.json)" in out
    assert json.loads((checkout / "metrics/eval/ppo.json").read_text()) == COMMITTED["eval/ppo"]


def test_another_cpu_reports_bytes_it_reproduced(checkout, check):
    """Pinned kernels can make another CPU family write the same bytes: the check says so."""
    made_elsewhere(checkout)
    status, out, _ = check(checkout)
    assert status == 0 and "outputs check: seed spread" in out
    assert "bytes: identical: this CPU reproduced every committed file byte for byte" in out


def test_the_signature_here_names_the_kernels_params_yaml_pins(checkout):
    assert reproduction.signature_here(checkout)["kernels"] == "avx2"
    (checkout / "params.yaml").write_text("cpu_kernels: native\n")
    assert reproduction.signature_here(checkout)["kernels"] == "native"


@pytest.mark.parametrize("win_rate", [0.49, 0.67])
def test_another_cpu_fails_a_number_outside_the_spread(checkout, check, win_rate):
    made_elsewhere(checkout)
    rerun(checkout, win_rate)
    status, _, err = check(checkout)
    assert status == 1
    assert f"eval/ppo:win: {win_rate:.4f} outside 0.5000 – 0.6600" in err
    assert "rm:acc" not in err


def test_the_committed_outputs_name_the_cpu_that_made_them():
    signature = json.loads((REPO / "docs" / "committed-cpu.json").read_text())
    assert set(signature) == set(cpu_signature("avx2"))


def test_rlhf_reproduced_is_the_same_check(checkout, monkeypatch):
    """What the README tells a user on another CPU to run: the table, and exit status 1 with a
    line for each number outside its band."""
    monkeypatch.chdir(checkout)
    made_elsewhere(checkout)
    rerun(checkout, 0.62)
    result = CliRunner().invoke(app, ["reproduced"])
    assert result.exit_code == 0, result.output
    assert "checking the seed spread (the committed outputs come from another CPU" in result.stderr
    assert "eval/ppo:win" in result.stdout and "0.6200" in result.stdout
    rerun(checkout, 0.49)
    result = CliRunner().invoke(app, ["reproduced"])
    assert result.exit_code == 1
    assert "eval/ppo:win: 0.4900 outside 0.5000 – 0.6600" in result.stderr


# Two CPUs' runs of one default, the band's real case: the README's install-and-run on an Intel
# Xeon (AVX-512 and AMX) at commit 8b77279, 2026-11-30, the numbers CI's seed-spread check read
# there (55 committed files differed), against the seeds an AMD EPYC had committed under the
# same avx2 kernels (`docs/seeds.json`'s spread at commit 30df735, the same default's).
AMD_EPYC_SEEDS = REPO / "tests/fixtures/amd_epyc_seeds_30df735.json"
INTEL_XEON_RUN = {
    "eval/sft:gold": 0.5648,
    "eval/sft:gold_greedy": 0.8459,
    "eval/sft:kl": 0.0000,
    "eval/ppo:win": 0.5881,
    "eval/ppo:win_t": 0.5324,
    "eval/ppo:win_greedy": 0.5293,
    "eval/ppo:win_bon": 0.5262,
    "eval/ppo:gold": 0.6902,
    "eval/ppo:gold_greedy": 0.8847,
    "eval/ppo:kl": 0.2644,
    "eval/grpo:win": 0.5276,
    "eval/grpo:win_t": 0.5017,
    "eval/grpo:win_greedy": 0.4955,
    "eval/grpo:win_bon": 0.4696,
    "eval/grpo:gold": 0.6133,
    "eval/grpo:gold_greedy": 0.8360,
    "eval/grpo:kl": 0.1961,
    "eval/dpo:win": 0.5642,
    "eval/dpo:win_t": 0.5017,
    "eval/dpo:win_greedy": 0.4932,
    "eval/dpo:win_bon": 0.4983,
    "eval/dpo:gold": 0.6589,
    "eval/dpo:gold_greedy": 0.8299,
    "eval/dpo:kl": 0.3243,
    "rm:acc": 0.8337,
}


def committed_spread() -> dict:
    return read_baseline(REPO / reproduction.SEEDS)


def outside(numbers: dict[str, float], seeds: Path = REPO / reproduction.SEEDS) -> list[str]:
    spread = {k: s for k, s in read_baseline(seeds).items() if k in numbers}
    return [r.failure() for r in read_against(numbers, spread, OTHER_CPU_STDS) if not r.within]


def test_another_cpus_run_of_the_default_lies_within_the_seed_spread():
    """Its GRPO `win` (0.5276) lies 4.5 of the AMD seeds' own standard deviation (0.0092) under
    their mean: the band credits each number with at least `MIN_STD`."""
    assert INTEL_XEON_RUN.keys() == read_baseline(AMD_EPYC_SEEDS).keys()
    assert outside(INTEL_XEON_RUN, AMD_EPYC_SEEDS) == []


@pytest.mark.parametrize("policy", ["ppo", "grpo", "dpo"])
def test_a_policy_that_learned_nothing_leaves_the_committed_spread(policy):
    """SFT itself as the policy: win rates of 0.5 however decoded, SFT's gold scores, no KL.
    The band is wide for three seeds, not so wide that a stage that stopped learning passes."""
    sft = committed_spread()
    stalled = {f"eval/{policy}:{k}": 0.5 for k in ("win", "win_t", "win_greedy", "win_bon")}
    stalled |= {f"eval/{policy}:{k}": sft[f"eval/sft:{k}"].mean for k in ("gold", "gold_greedy")}
    failed = {line.split(":")[1] for line in outside(stalled | {f"eval/{policy}:kl": 0.0})}
    assert {"gold", "kl"} <= failed


def test_a_reward_model_at_chance_leaves_the_committed_spread():
    (failure,) = outside({"rm:acc": 0.5})
    assert failure.startswith("rm:acc: 0.5000 outside ")
