"""Every way a checkpoint can be wrong is one CheckpointError naming the file."""

from __future__ import annotations

import os
import pickle
import random
import re

import pytest
import torch
from typer.testing import CliRunner

from rlhf.cli import app
from rlhf.errors import CheckpointError
from rlhf.models import checkpoint
from rlhf.models.gpt import GPT, GPTConfig


class RunsCode:
    """What a malicious checkpoint holds: unpickling it would call os.system."""

    def __reduce__(self):
        return (os.system, ("touch pwned",))


@pytest.fixture
def policy_file(tmp_path):
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=1, n_embd=8))
    path = tmp_path / "policy.pt"
    payload = {"kind": "policy", "backbone": "gpt", "model": model.state_dict(),
               "model_config": vars(model.config), "tokenizer": "t"}  # fmt: skip
    checkpoint.save(path, payload)
    return path


def test_a_checkpoint_that_would_run_code_is_refused_without_the_unsafe_hint(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": RunsCode()}, path)
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(path)
    message = str(err.value)
    assert message.startswith(f"{path}: refused: it does not load as weights only (Trying to")
    assert "posix.system" in message
    assert "weights_only" not in message and "\n" not in message
    plain = tmp_path / "plain.pt"  # pickle's protocol 4, not torch.save's zip: FRAME comes first
    plain.write_bytes(pickle.dumps({"model": RunsCode()}, protocol=4))
    with pytest.raises(CheckpointError, match=r"plain\.pt: refused: .* could run code"):
        checkpoint.load(plain)
    assert not (tmp_path / "pwned").exists()


def test_truncated_empty_and_missing_checkpoints_are_named(policy_file, tmp_path):
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(policy_file.read_bytes()[:200])
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    named = re.escape(f"{truncated}: not a readable checkpoint, truncated or corrupt (")
    with pytest.raises(CheckpointError, match=named + r"PytorchStreamReader failed [^.]*\)$"):
        checkpoint.load(truncated)
    with pytest.raises(CheckpointError, match=r"empty\.pt: an empty file, not a checkpoint"):
        checkpoint.load(empty)
    with pytest.raises(CheckpointError, match=r"missing\.pt: no such checkpoint"):
        checkpoint.load(tmp_path / "missing.pt")
    plain = tmp_path / "plain.pt"
    with plain.open("wb") as handle:
        pickle.dump([1, 2], handle)
    damaged = r"\.pt: not a readable checkpoint, truncated or corrupt \(Unsupported operand"
    with pytest.raises(CheckpointError, match="plain" + damaged):
        checkpoint.load(plain)
    noise = tmp_path / "noise.pt"  # random bytes name no callable: damage, not a threat
    noise.write_bytes(bytes(random.Random(0).randrange(256) for _ in range(4096)))
    with pytest.raises(CheckpointError, match="noise" + damaged):
        checkpoint.load(noise)


def test_a_checkpoint_lacking_keys_or_with_mismatched_weights_is_named(policy_file):
    payload = checkpoint.load(policy_file)
    checkpoint.save(policy_file, {k: v for k, v in payload.items() if k != "model"})
    with pytest.raises(CheckpointError, match=r"policy.pt: checkpoint lacks 'model'"):
        checkpoint.load_model(policy_file)
    wrong = dict(payload, model_config={**payload["model_config"], "n_embd": 16})
    checkpoint.save(policy_file, wrong)
    with pytest.raises(CheckpointError, match=r"policy.pt: its weights do not fit its 'gpt'"):
        checkpoint.load_model(policy_file)


def test_the_cli_reports_a_refused_checkpoint_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.save({"model": RunsCode()}, tmp_path / "evil.pt")
    from rlhf.tokenizer.tokenizer import save_tokenizer

    save_tokenizer(tmp_path / "tok", "bytes")
    for command in ("generate", "score"):
        args = [command, "evil.pt", "-p", "hi", "--tokenizer", "tok"]
        result = CliRunner().invoke(app, args + (["-r", "x"] if command == "score" else []))
        assert result.exit_code == 2, result.output
        (line,) = [line for line in result.output.splitlines() if line.strip()]
        assert line.startswith("error: evil.pt: refused:")
    assert not (tmp_path / "pwned").exists()
