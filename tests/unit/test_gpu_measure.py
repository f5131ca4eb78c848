"""`benchmarks/measure.py`, the GPU measuring step: each part's rows reach the disk as they are
measured, and a part that fails or overruns costs only its own rows still to come."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import measure  # noqa: E402


def part_command(rows: Path, part: str, then: str) -> list[str]:
    """A stand-in part: appends one row as the parts do, then runs `then`."""
    row = json.dumps({"part": part, "kind": "first"})
    code = f"import sys, time; open({str(rows)!r}, 'a').write({row!r} + '\\n'); {then}"
    return [sys.executable, "-c", code]


def test_a_failing_or_overrunning_part_keeps_its_rows_and_the_next_part_runs(tmp_path):
    rows = tmp_path / measure.ROWS
    crashed = measure.run_part("a", part_command(rows, "a", "sys.exit(3)"), 60, rows)
    started = time.monotonic()
    overran = measure.run_part("b", part_command(rows, "b", "time.sleep(60)"), 3, rows)
    stopped_after = time.monotonic() - started
    finished = measure.run_part("c", part_command(rows, "c", "pass"), 60, rows)

    assert (crashed, overran, finished) == (False, False, True)
    assert stopped_after < 30
    measured = measure.read_rows(rows)
    assert [(r["part"], r.get("kind"), r.get("error")) for r in measured] == [
        ("a", "first", None),
        ("a", None, "exit 3"),
        ("b", "first", None),
        ("b", None, "stopped after its 3 s"),
        ("c", "first", None),
        ("c", None, None),
    ]
    assert measured[-1]["done_s"] < 30


def test_a_partial_last_line_is_skipped_and_the_rows_before_it_are_read(tmp_path):
    rows = tmp_path / measure.ROWS
    rows.write_text(json.dumps({"part": "sft", "kind": "step"}) + '\n{"part": "ppo", "ki')
    assert measure.read_rows(rows) == [{"part": "sft", "kind": "step"}]


def test_each_part_gets_its_weights_share_of_the_time_left():
    parts = ["probe", "rollout", "ppo", "sft"]
    deadline = time.monotonic() + 900
    assert measure.time_limit(parts, 0, deadline) == pytest.approx(100, abs=1)
    assert measure.time_limit(parts, 1, deadline) == pytest.approx(900 * 3 / 8, abs=1)
    assert measure.time_limit(parts, 3, deadline) == pytest.approx(900, abs=1)


def test_a_target_whose_rows_are_missing_is_not_met_and_says_so():
    rows = [
        {
            "part": "rollout",
            "kind": "calls",
            "batch": 64,
            "tokens_per_s": 70_000,
            "call_over_steps": 1.5,
        },
        {"part": "ppo", "error": "stopped after its 200 s"},
    ]
    judged = {t["target"].split(":")[0]: (t["measured"], t["met"]) for t in measure.judge(rows)}
    assert judged["rollout at batch 64, 128 new tokens"] == (70_000, True)
    assert judged["a 32-token call within 1.3x 32 steady steps"] == (1.5, False)
    assert judged["rollout at batch 256, 128 new tokens"] == (None, False)
    assert judged["PPO iteration"] == (None, False)


@pytest.mark.slow
def test_the_driver_writes_each_parts_rows_and_the_summary_on_a_cpu(tmp_path):
    """The model folder and the probe part at the tiny shape, through the real driver."""
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "measure.py"),
            "--device",
            "cpu",
            "--shape",
            "tiny",
            "--parts",
            "probe",
            "--out-dir",
            str(tmp_path),
            "--seconds",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / measure.SUMMARY).read_text())
    assert summary["failed_parts"] == []
    calls = {r["call"] for r in summary["rows"] if r.get("kind") == "attention"}
    assert calls == {
        "sft step, causal",
        "prefill",
        "decode step",
        "packed forward, masked",
        "reward model, padded answers",
    }
    decode = next(r for r in summary["rows"] if r.get("call") == "decode step")
    assert decode["q"][2] == 1 and decode["mask"] and decode["aten_op"].startswith("aten::_scaled")
    heads = [r["vocab"] for r in summary["rows"] if r.get("kind") == "lm_head"]
    assert heads == [1024]  # already a multiple of 64: one row
