import json

import pytest

from rlhf.atomic import atomic_path, publication, remove_stale, write_csv, write_json
from rlhf.errors import OutputError


def test_failed_write_leaves_previous_output_intact(tmp_path):
    target = tmp_path / "out.json"
    write_json(target, {"v": 1})
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text('{"v": 2, "trunc')
        raise RuntimeError("killed mid-write")
    assert target.read_text() == '{\n  "v": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left behind


def test_an_existing_folder_is_never_replaced(tmp_path):
    """`rlhf import --out data/raw` once deleted the user's whole folder this way."""
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "README.md").write_text("mine")
    with pytest.raises(OutputError, match="raw is a folder; refusing to replace it"):
        write_json(folder, {"v": 1})
    assert (folder / "README.md").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["raw"]


def test_a_publication_replaces_files_and_declared_folders_together(tmp_path):
    report, metrics = tmp_path / "reports", tmp_path / "metrics.json"
    for version in ("a", "b"):
        with publication() as out:
            out[report].mkdir()
            (out[report] / version).write_text(version)
            write_json(out[metrics], {"v": version})
    assert [p.name for p in report.iterdir()] == ["b"]
    assert '"b"' in metrics.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "reports"]


def test_a_failed_publication_leaves_every_previous_output(tmp_path):
    model, metrics = tmp_path / "model.pt", tmp_path / "m" / "metrics.json"
    model.write_text("old model")
    (tmp_path / "m").mkdir()
    metrics.write_text("old metrics")
    with pytest.raises(OutputError, match="nothing was written"), publication() as out:
        out[model].write_text("new model")
        out[metrics]  # staged but never written: the commit fails after moving the model
    assert (model.read_text(), metrics.read_text()) == ("old model", "old metrics")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["m", "metrics.json", "model.pt"]


def test_stale_temporaries_of_a_killed_run_are_removed(tmp_path):
    target = tmp_path / "model.pt"
    for name in (".model.pt.abc.tmp", ".other.pt.abc.tmp"):
        (tmp_path / name).mkdir()
    remove_stale([target, tmp_path / "missing" / "x.json"])
    assert [p.name for p in tmp_path.iterdir()] == [".other.pt.abc.tmp"]


def test_csv_rows(tmp_path):
    write_csv(tmp_path / "m.csv", [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}])
    assert (tmp_path / "m.csv").read_text().splitlines() == ["step,loss", "1,0.5", "2,0.25"]


def test_json_outputs_write_negative_zero_as_zero(tmp_path):
    """SFT's KL to itself, rounded from -1e-9: `dvc metrics show` printed `-0.0`."""
    write_json(tmp_path / "m.json", {"kl": {"sft": -0.0, "ppo": 0.77}, "curve": [-0.0, 1.5]})
    assert json.loads((tmp_path / "m.json").read_text()) == {
        "curve": [0.0, 1.5], "kl": {"ppo": 0.77, "sft": 0.0},
    }  # fmt: skip
    assert "-0.0" not in (tmp_path / "m.json").read_text()
