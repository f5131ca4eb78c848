import pytest

from rlhf.atomic import atomic_path, write_csv, write_json


def test_failed_write_leaves_previous_output_intact(tmp_path):
    target = tmp_path / "out.json"
    write_json(target, {"v": 1})
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text('{"v": 2, "trunc')
        raise RuntimeError("killed mid-write")
    assert target.read_text() == '{\n  "v": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left behind


def test_directories_are_replaced_whole(tmp_path):
    target = tmp_path / "tok"
    for version in ("a", "b"):
        with atomic_path(target) as tmp:
            tmp.mkdir()
            (tmp / version).write_text(version)
    assert [p.name for p in target.iterdir()] == ["b"]


def test_csv_rows(tmp_path):
    write_csv(tmp_path / "m.csv", [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}])
    assert (tmp_path / "m.csv").read_text().splitlines() == ["step,loss", "1,0.5", "2,0.25"]
