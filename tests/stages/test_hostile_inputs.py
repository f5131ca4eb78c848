"""Hostile model folders (their templates, config.json and weights: issues 35 and 46) and
everyday user data (issue 35's table), through the entry points a user runs: each case exits
non-zero with exactly one `error:` line naming the file or key, no traceback, nothing written
outside the command's outputs, within its time bound (10 s beyond importing the entry point,
for what used to hang); a weights file linked into a cache outside the folder loads. The cases
live in `malformed_corpus.py`; the table's other rows are behaviour of a kind the corpus
cannot drive, tested where that behaviour lives:

- SIGTERM to a stage, two runs of one stage: `test_reliability.py`
  (`test_sigterm_stops_a_stage_as_ctrl_c_does_and_the_rerun_resumes`,
  `test_a_stage_another_process_runs_is_refused_in_one_line`);
- the resume-file refusal off a terminal, random bytes called code: `test_reliability.py`
  (`test_a_log_line_stays_one_line_off_a_terminal`), `test_checkpoint.py`;
- a handful of held-out prompts: `test_import.py`, `test_report.py` (the count beside every
  interval);
- exports transformers warns about: `test_hf_backbones.py`
  (`test_an_export_loads_in_transformers_without_a_warning`);
- label noise calibrated on other draws: `test_reward_model.py`
  (`test_the_realised_flip_share_is_the_target_on_any_data`);
- two `rlhf label` sessions under one name, resizes, arrow keys: `test_labeling.py`,
  `test_label_terminal.py`.
"""

from __future__ import annotations

from malformed_corpus import CASES, main

STAGE_CASES = ("model folder:", "your own", "own prompts", "data/raw/sft.parquet: a 2 MB row")
COMMAND_CASES = (
    "max-new-tokens beyond the context",
    "outside the project",
    "a prompts file with no prompt",
    "flat shape",
    "a NaN score",
    "jsonl: missing response",
    "skip-bad-rows",
)


def test_the_cases_exist():
    names = [case.name for case in CASES]
    for wanted in (*STAGE_CASES, *COMMAND_CASES):
        assert any(wanted in name for name in names), wanted
    hanging = [c for c in CASES if "10^10" in c.name or "billion layers" in c.name]
    assert len(hanging) == 2 and all(c.seconds == 10 for c in hanging)


def run_corpus(capsys, base, entry: str, cases: tuple[str, ...]) -> None:
    """Every case named through `entry`: all as expected, or the failing runs' table rows and
    output in the assertion."""
    status = main(["--entries", entry, "--only", *cases], base=base)
    printed = capsys.readouterr()
    failed = [line for line in printed.err.splitlines() if line.startswith("FAIL")]
    assert status == 0, "\n".join(failed) + "\n" + printed.out
    assert "0 tracebacks, 0 files changed outside the commands' outputs" in printed.out


def test_hostile_model_folders_and_data_are_one_line_before_any_training(trained_project, capsys):
    """Through `python -m rlhf.stages.X`, what `dvc repro` runs."""
    run_corpus(capsys, trained_project, "python-m", STAGE_CASES)


def test_the_cli_reports_bad_input_in_one_line(trained_project, capsys):
    run_corpus(capsys, trained_project, "rlhf", COMMAND_CASES)
