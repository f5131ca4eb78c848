"""MLflow as an optional tracker, against a real MLflow tracking server started here (SQLite
backend, a local artifact store), read back through MLflow's own client."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

mlflow = pytest.importorskip("mlflow")  # the `[mlflow-server]` extra, in `[dev]`

from mlflow.tracking import MlflowClient  # noqa: E402

from rlhf.train.curves import read_curve  # noqa: E402

from conftest import clean_env, sh  # noqa: E402

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("mlflow")
    uri = f"http://127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
         f"sqlite:///{folder / 'runs.db'}", "--artifacts-destination", str(folder / "artifacts"),
         "--host", "127.0.0.1", "--port", uri.rsplit(":", 1)[1], "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=(folder / "server.log").open("w"), env=clean_env(),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            said = (folder / "server.log").read_text()[-2000:]
            pytest.fail(f"mlflow server did not start: {said}")
        time.sleep(0.5)
    yield uri
    server.terminate()
    server.wait(timeout=30)


def test_stages_log_params_metrics_curves_and_the_report_under_one_parent_run(
    trained_project, tmp_path, mlflow_server
):
    project = tmp_path / "p"
    shutil.copytree(trained_project, project, ignore=shutil.ignore_patterns("__pycache__"))
    params_file = project / "params.yaml"
    params = yaml.safe_load(params_file.read_text())
    params["tracking"] = {"mlflow": mlflow_server, "experiment": "tiny"}
    params_file.write_text(yaml.safe_dump(params))
    assert "up to date" in sh(["dvc", "status"], project)  # tracking reruns nothing
    lock = (project / "dvc.lock").read_text()

    sh(["dvc", "repro", "--force", "--single-item", "rm", "evaluate"], project)

    assert (project / "dvc.lock").read_text() == lock  # the same outputs, tracked or not
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("tiny").experiment_id
    runs = client.search_runs([experiment])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {r.info.run_name: r for r in runs if r is not parent}
    assert set(children) == {"rm", "evaluate"}  # one parent for the one `dvc repro`
    for child in children.values():
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.info.status == "FINISHED"

    rm = children["rm"]
    assert rm.data.params["rm.lr"] == "0.002" and rm.data.params["seed"] == "7"
    assert "ppo.kl_coef" not in rm.data.params  # only the groups the stage depends on
    headline = json.loads((project / "metrics" / "rm.json").read_text())
    assert rm.data.metrics["acc"] == pytest.approx(headline["acc"])
    curve = read_curve(project / "dvclive" / "rm" / "plots" / "metrics", "train_loss")
    history = client.get_metric_history(rm.info.run_id, "train_loss")
    assert len(curve) > 1 and sorted((m.step, m.value) for m in history) == curve  # exactly

    evaluate = children["evaluate"]
    policy = json.loads((project / "metrics" / "eval" / "ppo.json").read_text())
    assert evaluate.data.metrics["ppo.win_t"] == pytest.approx(policy["win_t"])
    artifacts = {a.path for a in client.list_artifacts(evaluate.info.run_id, "reports")}
    assert "reports/eval.md" in artifacts
    report = client.download_artifacts(evaluate.info.run_id, "reports/eval.md", str(tmp_path))
    assert Path(report).read_text() == (project / "reports" / "eval.md").read_text()

    # a second pipeline run is a second parent (of its one stage, the quickest)
    sh(["dvc", "repro", "--force", "--single-item", "prepare"], project)
    runs = client.search_runs([experiment])
    assert len([r for r in runs if "mlflow.parentRunId" not in r.data.tags]) == 2


def test_without_a_tracking_uri_no_stage_imports_mlflow(trained_project):
    code = (
        "import sys; from rlhf.stages import rm; from rlhf.stages.support.tracking import track; "
        "track(rm.SPEC); print('mlflow' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=trained_project, env=clean_env(),
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
