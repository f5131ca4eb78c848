"""Fault injection on the tiny config: what a failed or interrupted command leaves behind.

Each failure must end in one `error:` line and a non-zero exit, change nothing outside the
command's own outputs, and leave the next run able to go on (issue 18's acceptance).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from typer.testing import CliRunner

from rlhf.cli import app
from rlhf.data.schemas import SFT_SCHEMA, read_rows
from rlhf.errors import ResourceError
from rlhf.locks import try_lock
from rlhf.models import checkpoint
from rlhf.models.gpt import GPT, GPTConfig
from rlhf.models.registry import build
from rlhf.params.groups import OptimParams
from rlhf.project.metric_files import read_metrics
from rlhf.stages import dpo
from rlhf.stages.support.entry import DEBUG_ENV
from rlhf.stages.support.outputs import STAGE_LOCKS
from rlhf.train import batches, loop
from rlhf.train.guard import NonFiniteError
from rlhf.train.memory import (
    HEAD_GRADIENT_COPIES,
    MARGIN,
    SAMPLING_VOCAB_FLOATS,
    Workload,
    estimate_bytes,
    preflight,
)

from conftest import (
    assert_resume_matches,
    clean_env,
    import_seconds,
    kill_at_first_save,
    make_project,
    run_module,
    start_until_saved,
    write_params,
)


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(directory) -> dict[str, str]:
    """Every file under `directory` with its digest."""
    return {
        str(p.relative_to(directory)): digest(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def one_error_line(stderr: str, *needles: str) -> str:
    """The single `error:` line of a failed command, which must hold every needle."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def copy_of(trained_project, directory):
    shutil.copytree(trained_project, directory, ignore=shutil.ignore_patterns("__pycache__"))
    return directory


# -- `rlhf import --out` -------------------------------------------------------------------


def demos_file(tmp_path):
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps({"prompt": "Say hi.", "response": "Hi!"}) + "\n")
    return path


def test_import_into_an_existing_folder_writes_inside_and_keeps_every_file(tmp_path, monkeypatch):
    project = make_project(tmp_path / "p")
    monkeypatch.chdir(project)  # a folder outside the project is refused: the file must be named
    raw = project / "data" / "raw"
    (raw / "comparisons.parquet").write_bytes(b"the user's comparisons")
    before = tree(raw)
    result = CliRunner().invoke(app, ["import", str(demos_file(tmp_path)), "--out", str(raw)])
    assert result.exit_code == 0, result.output
    assert raw.is_dir()
    after = tree(raw)
    assert {k: v for k, v in after.items() if k != "sft.parquet"} == before
    assert read_rows(raw / "sft.parquet", SFT_SCHEMA)[0]["response"] == "Hi!"


def test_import_replaces_an_existing_file_only_with_force(tmp_path):
    out = tmp_path / "mine.parquet"
    out.write_bytes(b"not ours")
    runner, source = CliRunner(), str(demos_file(tmp_path))
    refused = runner.invoke(app, ["import", source, "--out", str(out)])
    assert refused.exit_code == 2
    assert "mine.parquet exists; pass --force" in refused.output
    assert out.read_bytes() == b"not ours"
    forced = runner.invoke(app, ["import", source, "--out", str(out), "--force"])
    assert forced.exit_code == 0, forced.output
    assert read_rows(out, SFT_SCHEMA)[0]["prompt"] == "Say hi."


# -- non-finite losses ----------------------------------------------------------------------


def test_nan_loss_stops_the_loop_before_its_update_and_names_the_last_resume(tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=1, n_embd=8))
    ids = torch.randint(0, 16, (4, 8))
    weights: dict[int, dict[str, torch.Tensor]] = {}

    def batch_loss(rows: list[int]) -> tuple[torch.Tensor, int]:
        step = len(weights) + 1
        weights[step] = {k: v.clone() for k, v in model.state_dict().items()}
        loss = model(ids[rows]).logsumexp(-1).mean()
        return (loss * float("nan") if step == 3 else loss), 8

    resume = tmp_path / "resume.pt"
    opt = OptimParams(epochs=5, batch_size=2, save_every=2, warmup_steps=0)
    with pytest.raises(NonFiniteError) as caught:
        loop.fit(
            model, opt, loop.Objective(batch_loss), seed=0, n_examples=4,
            device=torch.device("cpu"), resume=loop.ResumeFile(resume, "f"),
            callbacks=loop.Callbacks(log=lambda _: None),
        )  # fmt: skip
    message = str(caught.value)
    assert message.startswith("training step 3: non-finite train_loss nan")
    assert f"last good resume state: {resume} (step 2)" in message
    for name, tensor in model.state_dict().items():  # the NaN step changed nothing
        assert torch.equal(tensor, weights[3][name]), name
    assert checkpoint.load(resume)["step"] == 2


def test_a_steps_numbers_are_read_once_the_next_steps_backward_is_queued(monkeypatch, tmp_path):
    """The finiteness check off the critical path: the host reads step k's loss and gradient
    norm after it has run step k + 1's forward and backward (on a GPU, while the device
    still works on them), except where the loop needs them at once: an epoch's last step,
    one before a save, the run's last. 2 epochs of 3 steps, a save after step 4."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=1, n_embd=8))
    ids = torch.randint(0, 16, (6, 8))
    events: list[str] = []

    def batch_loss(rows: list[int]) -> tuple[torch.Tensor, int]:
        events.append(f"loss {sum(e.startswith('loss') for e in events) + 1}")
        return model(ids[rows]).logsumexp(-1).mean(), 8

    read = batches.Readback.read
    monkeypatch.setattr(batches.Readback, "read", lambda self: events.append("read") or read(self))
    opt = OptimParams(epochs=2, batch_size=2, save_every=4, warmup_steps=0)
    history, _ = loop.fit(
        model, opt, loop.Objective(batch_loss), seed=0, n_examples=6,
        device=torch.device("cpu"), resume=loop.ResumeFile(tmp_path / "resume.pt", "f"),
        callbacks=loop.Callbacks(log=lambda _: None),
    )  # fmt: skip
    reads = " ".join(events).replace("loss ", "L").replace("read", "R")
    assert reads == "L1 L2 R L3 R R L4 R L5 L6 R R"
    assert [row["step"] for row in history.steps] == [1, 2, 3, 4, 5, 6]


def test_nan_loss_stops_the_dpo_stage_and_changes_no_output(trained_project, tmp_path, monkeypatch):
    """With a loss that turns NaN at step 2, today's main trained on and wrote NaN weights
    and metrics; now the stage stops with the step and the terms, and writes nothing."""
    project = copy_of(trained_project, tmp_path / "p")
    outputs = {
        p: digest(project / p)
        for p in ("artifacts/dpo/model.pt", "metrics/dpo.json", "metrics/details/dpo.json")
    }
    write_params(project, {"dpo.save_every": 100})
    pair_loss, calls = dpo.pair_loss, []

    def poisoned(*args, **kwargs):
        loss, stats, tokens = pair_loss(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            return loss * float("inf") * 0, {**stats, "reward_margin": float("nan")}, tokens
        return loss, stats, tokens

    monkeypatch.setattr(dpo, "pair_loss", poisoned)
    monkeypatch.chdir(project)
    with pytest.raises(NonFiniteError, match=r"step 2: non-finite train_loss nan, reward_margin"):
        dpo.run()
    assert {p: digest(project / p) for p in outputs} == outputs


# -- resume state ----------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"garbage, not a checkpoint", "truncated"])
def test_unreadable_resume_state_is_moved_aside_and_ignored(tmp_path, content):
    resume = tmp_path / "sft.pt"
    if content == "truncated":
        checkpoint.save(resume, {"step": 3, "fingerprint": "f", "x": torch.ones(1000)})
        content = resume.read_bytes()[:-100]
    resume.write_bytes(content)
    logged: list[str] = []
    assert checkpoint.load_resume(resume, "f", ("step",), logged.append) is None
    assert not resume.exists()
    (aside,) = tmp_path.glob("sft.pt.unreadable-*")
    assert aside.read_bytes() == content
    assert len(logged) == 1 and "starting fresh" in logged[0] and str(aside) in logged[0]


def test_resume_state_lacking_keys_is_moved_aside(tmp_path):
    resume = tmp_path / "sft.pt"
    checkpoint.save(resume, {"fingerprint": "f"})
    assert checkpoint.load_resume(resume, "f", ("model", "step"), lambda _: None) is None
    assert list(tmp_path.glob("sft.pt.unreadable-*"))


def test_sft_starts_fresh_over_garbage_resume_state_and_clears_stale_temporaries(
    trained_project, tmp_path
):
    """Today's main failed with a traceback on every rerun until the file was deleted."""
    project = make_project(tmp_path / "p")
    shutil.copytree(trained_project / "data" / "prepared", project / "data" / "prepared")
    shutil.copytree(
        trained_project / "artifacts" / "tokenizer", project / "artifacts" / "tokenizer"
    )
    resume_dir = project / ".rlhf" / "resume"
    resume_dir.mkdir(parents=True)
    (resume_dir / "sft.pt").write_bytes(b"\x00" * 64)
    stale = [resume_dir / ".sft.pt.k1ll3d.tmp", project / "artifacts" / "sft" / ".model.pt.x.tmp"]
    for path in stale:
        path.mkdir(parents=True)
        (path / "half").write_bytes(b"half-written")
    rerun = run_module("rlhf.stages.sft", project)
    assert "moved to" in rerun.stderr and "starting fresh" in rerun.stderr
    assert len(list(resume_dir.glob("sft.pt.unreadable-*"))) == 1
    assert not any(path.exists() for path in stale)
    resumed, uninterrupted = (read_metrics("sft", p) for p in (project, trained_project))
    assert resumed == uninterrupted


def test_killed_rm_resumes_and_matches_an_uninterrupted_run(trained_project, tmp_path):
    project = copy_of(trained_project, tmp_path / "p")
    for path in ("artifacts/rm", "metrics/rm.json", "metrics/details/rm.json"):
        shutil.rmtree(project / path) if (project / path).is_dir() else (project / path).unlink()
    write_params(project, {"rm.save_every": 2})
    resume = kill_at_first_save(project, "rlhf.stages.rm", project / ".rlhf" / "resume" / "rm.pt")
    assert not (project / "artifacts" / "rm" / "model.pt").exists()  # no half output
    assert_resume_matches(project, trained_project, "rm", resume)


def test_a_stage_another_process_runs_is_refused_in_one_line(trained_project, tmp_path):
    """However each is started, two runs of one stage would race to its outputs and the second
    would delete the first's temporaries: it is refused at once, changing nothing."""
    project = copy_of(trained_project, tmp_path / "p")
    write_params(project, {"rm.epochs": 2})  # out of date: it would run
    stale = project / ".rlhf" / "resume" / ".rm.pt.k1ll3d.tmp"  # the running one's save
    stale.mkdir(parents=True)
    (stale / "half").write_bytes(b"half-written")
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    running = try_lock(project / STAGE_LOCKS / "rm.lock")  # as a running rm holds it
    start = time.monotonic()
    second = subprocess.run(
        [sys.executable, "-m", "rlhf.stages.rm"],
        cwd=project, env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert second.returncode == 2 and time.monotonic() - start < 10 + import_seconds(
        "rlhf.stages.rm"
    )
    one_error_line(second.stderr, "stage rm is already running", ".rlhf/locks/rm.lock")
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before
    running.close()
    run_module("rlhf.stages.rm", project)  # released: it runs, and clears the temporary
    assert not stale.exists()


def test_sigterm_stops_a_stage_as_ctrl_c_does_and_the_rerun_resumes(trained_project, tmp_path):
    """`kill`, `docker stop` or a scheduler's cancel: a line, exit 130, the resume state kept."""
    project = copy_of(trained_project, tmp_path / "p")
    for path in ("artifacts/rm", "metrics/rm.json", "metrics/details/rm.json"):
        shutil.rmtree(project / path) if (project / path).is_dir() else (project / path).unlink()
    write_params(project, {"rm.save_every": 2})
    resume = project / ".rlhf" / "resume" / "rm.pt"
    running = start_until_saved(project, "rlhf.stages.rm", resume)
    running.send_signal(signal.SIGTERM)
    _, stopped = running.communicate(timeout=60)
    assert running.returncode == 130
    one_error_line(stopped, "interrupted; run the command again to resume")
    assert_resume_matches(project, trained_project, "rm", resume)


# -- all outputs or none ----------------------------------------------------------------------


def test_unwritable_metrics_leave_every_output_of_the_stage_as_it_was(trained_project, tmp_path):
    """Today's main replaced artifacts/rm/model.pt, then failed on metrics/: a new model
    beside old metrics. `metrics` is made a plain file, which no user can write into (file
    modes would not stop the root user these tests may run as)."""
    project = copy_of(trained_project, tmp_path / "p")
    shutil.rmtree(project / "metrics")
    (project / "metrics").write_text("not a folder")
    write_params(project, {"rm.lr": 0.003})  # a new model would differ from the old one
    before = tree(project)
    result = subprocess.run(
        [sys.executable, "-m", "rlhf.stages.rm"],
        cwd=project, env=clean_env(), capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2
    one_error_line(result.stderr, "metrics/details/rm.json", "cannot write there")
    live = project / ".rlhf" / "live" / "rm" / "plots" / "metrics"
    assert (live / "train_loss.tsv").is_file()  # the failed run's curves, kept to look at
    shutil.rmtree(project / ".rlhf" / "live")
    assert tree(project) == before


def test_memory_preflight_refuses_what_the_device_cannot_hold():
    huge = {"vocab_size": 50257, "block_size": 1024, "n_layer": 96, "n_head": 128, "n_embd": 16384}
    with pytest.raises(ResourceError, match=r"needs about \d+\.\d GiB .* but cpu has"):
        preflight("sft", "gpt", huge, Workload(sequences=32), torch.device("cpu"))
    tiny = {"vocab_size": 400, "block_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 48}
    assert 0 < preflight("sft", "gpt", tiny, Workload(sequences=16), torch.device("cpu")) < 2**30


def test_the_preflight_prices_sharded_and_adapted_models_as_they_are_held():
    """fsdp2 keeps 1/N of a trained model's 16 bytes a parameter, plus one whole fp32 copy at
    a time; a LoRA base is frozen fp32 (4 bytes) even where frozen models are bf16."""
    shape = {"vocab_size": 50257, "block_size": 1024, "n_layer": 24, "n_head": 16, "n_embd": 1024}
    with torch.device("meta"):
        params = sum(p.numel() for p in build("gpt", shape).parameters())
    head_gradients = 4 * HEAD_GRADIENT_COPIES * shape["vocab_size"] * shape["n_embd"]

    def estimate(work: Workload) -> int:
        return estimate_bytes("gpt", shape, work)

    assert estimate(Workload(trained=1)) == round(MARGIN * (16 * params + head_gradients))
    sharded = 16 * params / 8 + 4 * params + head_gradients
    assert estimate(Workload(trained=1, sharded_over=8)) == round(MARGIN * sharded)
    assert estimate(Workload(trained=0, adapted=1, frozen_bf16=True)) == round(MARGIN * 4 * params)
    assert estimate(Workload(trained=0, frozen=1, frozen_bf16=True)) == round(MARGIN * 2 * params)


@pytest.mark.parametrize("checkpointed", [False, True])
@pytest.mark.parametrize(
    ("backbone", "shape"),
    [
        ("gpt", {"vocab_size": 400, "block_size": 64, "n_layer": 7, "n_head": 2, "n_embd": 48}),
        ("llama", {"vocab_size": 300, "block_size": 96, "n_layer": 5, "n_head": 4,
                   "n_kv_head": 2, "n_embd": 64, "tie_embeddings": False}),
    ],
)  # fmt: skip
def test_the_preflight_counts_what_the_whole_model_built_on_meta_holds(
    backbone, shape, checkpointed
):
    """The estimate extrapolates from one and two blocks; built whole, the model agrees.
    Beside the weights, activations and cache: the trained model's LM-head gradient copies
    and each sampled row's vocabulary-wide floats."""
    with torch.device("meta"):
        model = build(backbone, shape)
    model.activation_checkpointing = checkpointed
    params = sum(p.numel() for p in model.parameters())
    seq_len, vocab = model.max_seq_len, shape["vocab_size"]
    per_token = model.activation_floats(seq_len)
    work = Workload(trained=1, frozen=2, sequences=3, sampled=5, checkpointed=checkpointed)
    floats = seq_len * (3 * per_token + 5 * model.cache_floats())
    floats += HEAD_GRADIENT_COPIES * vocab * shape["n_embd"] + 5 * SAMPLING_VOCAB_FLOATS * vocab
    whole = 16 * params + 8 * params + 4 * floats
    assert estimate_bytes(backbone, shape, work) == round(MARGIN * whole)


def test_the_preflight_takes_constant_time_whatever_the_depth():
    deep = {"vocab_size": 400, "block_size": 64, "n_layer": 10**9, "n_head": 2, "n_embd": 48}
    start = time.monotonic()
    with pytest.raises(ResourceError, match="n_layer 1000000000"):
        preflight("sft", "gpt", deep, Workload(sequences=1), torch.device("cpu"))
    assert time.monotonic() - start < 5


def test_a_model_too_big_for_the_machine_is_refused_in_one_line(trained_project, tmp_path):
    project = copy_of(trained_project, tmp_path / "p")
    write_params(project, {"model": {"n_layer": 96, "n_head": 128, "n_embd": 16384}})
    result = subprocess.run(
        [sys.executable, "-m", "rlhf.stages.sft"],
        cwd=project, env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    one_error_line(result.stderr, "sft needs about", "GiB", "n_layer 96")


# -- one line on every entry point -------------------------------------------------------------


def test_params_error_is_one_line_from_python_m_cli_and_dvc(trained_project, tmp_path, monkeypatch):
    project = copy_of(trained_project, tmp_path / "p")  # a DVC project already
    write_params(project, {"sft.lr": "fast"})
    module = subprocess.run(
        [sys.executable, "-m", "rlhf.stages.sft"],
        cwd=project, env=clean_env(), capture_output=True, text=True,
    )  # fmt: skip
    assert module.returncode == 2
    one_error_line(module.stderr, "params.yaml: sft.lr = 'fast' has the wrong type")

    repro = subprocess.run(
        ["dvc", "repro", "--single-item", "sft"],
        cwd=project, env=clean_env(), capture_output=True, text=True,
    )  # fmt: skip
    assert repro.returncode != 0
    one_error_line(repro.stdout + repro.stderr, "params.yaml: sft.lr = 'fast'")

    monkeypatch.chdir(project)
    cli = CliRunner().invoke(app, ["sft"])
    assert cli.exit_code == 2
    one_error_line(cli.output, "sft.lr = 'fast'")

    monkeypatch.setenv(DEBUG_ENV, "0")  # restored after the test: --debug sets it
    debug = CliRunner().invoke(app, ["--debug", "sft"])
    assert debug.exit_code != 0 and debug.exception is not None  # the traceback is kept


def test_the_malformed_input_corpus_runs_and_its_cli_cases_pass(trained_project, capsys):
    """A few cases of `tests/malformed_corpus.py` (the whole corpus takes minutes), each run
    through every `rlhf` command it declares."""
    from malformed_corpus import CASES, entries_of, main

    assert len(CASES) >= 25
    only = ["jsonl: invalid UTF-8", "import: --out an existing folder", "checkpoint: empty file"]
    commands = [entries_of(c, {"rlhf"}) for c in CASES if any(name in c.name for name in only)]
    assert len(commands) == len(only) and all(commands)  # one case each, with `rlhf` commands
    runs = sum(map(len, commands))
    assert main(["--entries", "rlhf", "--only", *only], base=trained_project) == 0
    table = capsys.readouterr().out
    summary = f"{len(only)} cases, {runs} runs: {runs}/{runs} as expected (100%), 0 tracebacks"
    assert f"{summary}, 0 files changed" in table


def test_a_log_line_stays_one_line_off_a_terminal():
    """Rich wraps at 80 columns when it cannot ask a terminal: a CI or Prefect log would get
    one message over several lines."""
    message = "resume state .rlhf/resume/sft.pt: not a readable checkpoint " + "x" * 300
    script = (
        "import sys; from rlhf.stages.support.common import console; "
        "from rlhf.stages.support.entry import print_error; "
        "console.print(sys.argv[1]); print_error(sys.argv[1])"
    )
    logged = subprocess.run(
        [sys.executable, "-c", script, message], capture_output=True, text=True, check=True
    ).stderr.splitlines()
    assert logged == [message, f"error: {message}"]
