"""The Docker work pool `rlhf deploy` creates from docker-work-pool.json, rendered for a flow run
by prefect-docker itself (no Docker engine here): what a GPU host's worker would start.

A module of its own, with its own temporary Prefect server: `rlhf deploy` registers the shipped
deployments on the Docker pool, where the flow tests register the same names on a process pool.
"""

from __future__ import annotations

import asyncio
import subprocess

import pytest

# GPU hosts run the suite without Prefect and its Docker worker (benchmarks/gpu.sh)
pytest.importorskip("prefect_docker")

from docker.models.containers import _create_container_args
from prefect import get_client
from prefect_docker.worker import DockerWorker, DockerWorkerJobConfiguration

from rlhf.flows.deploy import deployment_env, image_tag

from conftest import make_project, prefect_env


class EngineVersion:
    """What prefect-docker asks the Docker engine while building a container's settings."""

    def version(self) -> dict[str, str]:
        return {"Version": "27.3.1"}


async def rendered_container(flow_run_id) -> dict:
    """The arguments a Docker worker of the pool would create the flow run's container
    with, through prefect-docker's rendering and docker-py's own argument building."""
    async with get_client() as client:
        flow_run = await client.read_flow_run(flow_run_id)
        pool = await client.read_work_pool("rlhf-docker")
        config = await DockerWorkerJobConfiguration.resolve_for_flow_run(
            flow_run, client=client, work_pool=pool, worker_name="gpu-host"
        )
    settings = DockerWorker(work_pool_name="rlhf-docker")._build_container_settings(
        EngineVersion(), config
    )
    return _create_container_args({**settings, "version": "1.47"})


def test_the_shipped_docker_pool_gives_a_stage_container_its_gpus(prefect_server, tmp_path):
    project = make_project(tmp_path / "gpu-host" / "repository")
    deploy = subprocess.run(
        ["rlhf", "deploy"],
        cwd=project,
        env=prefect_env(prefect_server),
        capture_output=True,
        text=True,
    )
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    with get_client(sync_client=True) as client:
        assert client.read_work_pool("rlhf-docker").type == "docker"
        stage = client.read_deployment_by_name("rlhf-stage/rlhf-stage")
        nightly = client.read_deployment_by_name("rlhf-pipeline/rlhf-pipeline")
        two_gpus = client.create_flow_run_from_deployment(
            stage.id, parameters={"stage": "rl@ppo"}, job_variables={"gpus": 2}
        )
        orchestration = client.create_flow_run_from_deployment(nightly.id)
    container = asyncio.run(rendered_container(two_gpus.id))
    host = container["host_config"]
    assert [(r["Driver"], r["Count"], r["Capabilities"]) for r in host["DeviceRequests"]] == [
        ("nvidia", 2, [["gpu"]])
    ]
    assert container["image"] == "rlhf-pipeline:latest"
    assert container["entrypoint"] == ["/usr/bin/tini", "-g", "--"]  # not the image's `rlhf`
    assert container["command"] == "prefect flow-run execute"
    assert container["environment"]["PREFECT__FLOW_RUN_ID"] == str(two_gpus.id)
    # bridged: the host's loopback services are out of reach; the server's local address
    # becomes the host's gateway, which the server must listen on (README: the Docker pool)
    assert host["NetworkMode"] == "bridge"
    local = prefect_server.replace("127.0.0.1", "host.docker.internal")
    assert container["environment"]["PREFECT_API_URL"] == local
    assert host["ExtraHosts"] == ["host.docker.internal:host-gateway"]
    storage = tmp_path / "gpu-host" / "rlhf-pipeline-storage"
    assert host["Binds"] == [f"{project}:/workspace", f"{storage}:/rlhf-pipeline-storage"]
    assert host["ShmSize"] == 8 * 2**30
    assert host["AutoRemove"] is True  # finished containers do not pile up on the GPU host
    counts = [r["Count"] for r in asyncio.run(rendered_container(orchestration.id))[
        "host_config"]["DeviceRequests"]]  # fmt: skip
    assert counts == [0]  # docker run --gpus 0: NVIDIA_VISIBLE_DEVICES=void


def test_deploy_gives_the_stage_containers_the_gpus_the_host_has(prefect_server, tmp_path):
    """`rlhf deploy --gpus 0` on a host without GPUs: the stage containers ask for none, and
    the pipeline's own container still asks for none."""
    project = make_project(tmp_path / "cpu-host")
    deploy = subprocess.run(
        ["rlhf", "deploy", "--gpus", "0"], cwd=project, env=prefect_env(prefect_server),
        capture_output=True, text=True,
    )  # fmt: skip
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    with get_client(sync_client=True) as client:
        runs = [
            client.create_flow_run_from_deployment(client.read_deployment_by_name(name).id)
            for name in ("rlhf-stage/rlhf-stage", "rlhf-pipeline/rlhf-pipeline")
        ]
    for run in runs:
        container = asyncio.run(rendered_container(run.id))
        assert [r["Count"] for r in container["host_config"]["DeviceRequests"]] == [0]
        assert container["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"  # Docker < 27


def test_deployments_name_the_image_of_the_commit_they_deploy(tmp_path):
    """Not `latest`, which a GPU host may hold from any older build: the commit, as
    `.ci/image` tags what it builds, `-dirty` when a tracked file differs from it."""
    assert image_tag(tmp_path) == "latest"  # no git repository
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "f").write_text("a")
    for args in (["init", "-q"], ["add", "f"], ["commit", "-qm", "f"]):
        subprocess.run([*git, *args], cwd=tmp_path, check=True)
    commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=tmp_path,
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert image_tag(tmp_path) == deployment_env(tmp_path)["RLHF_IMAGE_TAG"] == commit
    (tmp_path / "f").write_text("b")
    assert image_tag(tmp_path) == f"{commit}-dirty"
