"""Step 6 of .ci/image: the Prefect Docker production path, end to end, on this machine.

    python .ci/prefect_docker.py --engine podman --image rlhf-pipeline:TAG --work DIR --uid 1000

What a GPU host's operator runs, with the tiny project and `gpus: 0`:
1. the Docker API: the engine's own (`docker`), or `podman system service` on a socket in DIR;
2. a temporary Prefect server listening on the default bridge network's gateway (the address
   bridged containers reach the host at), with an API auth string, as the README asks of a
   server that containers reach;
3. the tiny project as a git repository with a local DVC remote beside it (`..` of the
   repository, mounted as /rlhf-pipeline-storage), owned by the image's user;
4. `rlhf deploy --gpus 0` there (the pool from docker-work-pool.json, both deployments on the
   image just built), then `prefect worker start --pool rlhf-docker`;
5. a run of the nightly deployment: it runs in a container of its own and starts every stage as
   a run of rlhf-stage, each in a container of its own. Checked: the pipeline and every stage's
   flow run Completed, one container per stage (their ids printed), the experiment recorded
   in the repository with every stage's metrics, the outputs pushed to the remote, and no
   container left behind (the pool's auto_remove);
6. a bad params value committed (data.n_train: 0): the next run fails, with the prepare stage's
   one `error:` line as its message.
Prints a summary and exits non-zero on the first failed check.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path

import yaml

RUN_TIMEOUT_S = 1200  # a whole tiny pipeline, one container per stage, on 2 cores
PARAM_ERROR_KEY = "data.n_train"
GIT_IDENTITY = {"NAME": "rlhf ci", "EMAIL": "ci@rlhf-pipeline.invalid"}


class CheckFailed(Exception):
    pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise CheckFailed(what)
    print(f"  ok: {what}")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("docker", "podman"), required=True)
    parser.add_argument("--image", required=True, help="NAME:TAG of the image built")
    parser.add_argument("--work", type=Path, required=True, help="scratch folder")
    parser.add_argument("--uid", type=int, required=True, help="the image's user")
    parser.add_argument("--gid", type=int, required=True)
    return parser.parse_args()


def wait_for(what: str, ready, timeout_s: float, process: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise CheckFailed(f"{what}: the process ended with status {process.returncode}")
        try:
            if result := ready():
                return result
        except Exception:  # not up yet
            pass
        time.sleep(0.5)
    raise CheckFailed(f"{what}: not ready within {timeout_s:g} s")


@contextmanager
def background(command: list[str], log: Path, env: dict[str, str], cwd: Path | None = None):
    """`command` running, its output in `log`, stopped (SIGTERM, then SIGKILL) at the end."""
    print(f"+ {' '.join(command)} > {log}")
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def docker_api(engine: str, work: Path, stack: ExitStack, env: dict[str, str]) -> str:
    """The Docker API's address: podman's service on a socket of our own, or docker's."""
    if engine == "docker":
        return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    path = work / "podman.sock"
    path.unlink(missing_ok=True)
    address = f"unix://{path}"
    service = stack.enter_context(
        background(["podman", "system", "service", "--time=0", address], work / "podman.log", env)
    )
    wait_for("podman system service", path.exists, 30, service)
    return address


def bridge_gateway(client) -> str:
    """The host's address on the engine's default bridge network (docker0's 172.17.0.1,
    podman's 10.88.0.1): what a bridged container reaches the host at."""
    for network in client.networks.list():
        if network.name in ("bridge", "podman"):
            for config in network.attrs.get("IPAM", {}).get("Config") or []:
                if config.get("Gateway"):
                    return config["Gateway"]
    raise CheckFailed("no default bridge network with a gateway")


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    print(f"+ {' '.join(command)}")
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise CheckFailed(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def make_repository(work: Path, src: Path, env: dict[str, str]) -> Path:
    """The test suite's tiny project, committed, with a local DVC remote `..` of it."""
    sys.path[:0] = [str(src / "tests"), str(src)]
    from conftest import init_dvc_repo, make_project

    top = work / "prefect"
    shutil.rmtree(top, ignore_errors=True)
    repository = init_dvc_repo(make_project(top / "repository"))
    storage = top / "rlhf-pipeline-storage"
    storage.mkdir()
    run(["dvc", "remote", "add", "-d", "storage", "../rlhf-pipeline-storage"], repository, env)
    run(["git", "add", "-A"], repository, env)
    run(["git", "commit", "-qm", "the tiny project"], repository, env)
    return repository


def hand_over(repository: Path, uid: int, gid: int) -> None:
    """The repository and its remote to the image's user, as a GPU host's operator owns the
    clone the containers write to (when this runs as root; else they are ours already)."""
    if os.getuid() == 0:
        for path in (repository.parent, *repository.parent.rglob("*")):
            os.lchown(path, uid, gid)


def no_flow_run_container(engine) -> bool:
    return not engine.containers.list(all=True, filters={"label": "io.prefect.flow-run-id"})


def in_image(engine, image: str, repository: Path, user: str, *command: str) -> str:
    """`command`'s output, run in the image as the repository's owner (as the stages were), on
    the repository and its remote mounted where the deployments mount them."""
    print(f"+ (in {image}) {' '.join(command)}")
    mounts = {
        str(repository): {"bind": "/workspace", "mode": "rw"},
        str(repository.parent / "rlhf-pipeline-storage"): {
            "bind": "/rlhf-pipeline-storage", "mode": "rw",
        },
    }  # fmt: skip
    identity = {f"GIT_{role}_{key}": value for role in ("AUTHOR", "COMMITTER")
                for key, value in GIT_IDENTITY.items()}  # fmt: skip
    output = engine.containers.run(
        image, list(command[1:]), entrypoint=[command[0]], user=user, volumes=mounts,
        working_dir="/workspace", network_mode="none", environment=identity, remove=True,
    )  # fmt: skip
    return output.decode()


def pipeline_run(client, deployment_id, stage_deployment_id):
    """Start a run of the nightly deployment and wait for it: (its final flow run, the stage
    flow runs it started, in order)."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.sorting import FlowRunSort

    parameters = {"start_timeout_s": 300, "stage_timeout_s": 900}
    flow_run = client.create_flow_run_from_deployment(deployment_id, parameters=parameters)
    print(f"  flow run {flow_run.name} ({flow_run.id})")
    started = time.monotonic()
    while not (state := client.read_flow_run(flow_run.id).state) or not state.is_final():
        if time.monotonic() - started > RUN_TIMEOUT_S:
            raise CheckFailed(f"the pipeline run did not end within {RUN_TIMEOUT_S} s")
        time.sleep(2)
    flow_run = client.read_flow_run(flow_run.id)
    print(f"  ended {flow_run.state.name} after {time.monotonic() - started:.0f} s")
    stages = client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[stage_deployment_id])),
        sort=FlowRunSort.START_TIME_ASC,
    )
    return flow_run, [s for s in stages if s.created >= flow_run.created]


def main() -> int:
    args = arguments()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src"  # .ci/image's copy of the tracked files
    venv_bin = Path(sys.executable).parent
    name, _, tag = args.image.rpartition(":")
    auth = f"rlhf:{secrets.token_urlsafe(16)}"
    env = os.environ | {
        "PATH": f"{venv_bin}:{os.environ['PATH']}",
        "PYTHONPATH": "",
        "DVC_NO_ANALYTICS": "1",
        "PREFECT_HOME": str(work / "prefect-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_AUTH_STRING": auth,
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        **{
            f"GIT_{role}_{key}": value
            for role in ("AUTHOR", "COMMITTER")
            for key, value in GIT_IDENTITY.items()
        },
    }
    env.pop("VIRTUAL_ENV", None)
    shutil.rmtree(env["PREFECT_HOME"], ignore_errors=True)  # a temporary server: a fresh database
    timings: list[tuple[str, float]] = []
    with ExitStack() as stack:
        clock = time.monotonic()
        env["DOCKER_HOST"] = docker_api(args.engine, work, stack, env)
        import docker

        engine = docker.DockerClient(base_url=env["DOCKER_HOST"])
        wait_for("the Docker API", engine.ping, 30)
        gateway = bridge_gateway(engine)
        port = free_port(gateway)
        env["PREFECT_API_URL"] = f"http://{gateway}:{port}/api"
        print(f"Docker API {env['DOCKER_HOST']}; Prefect server on the bridge gateway {gateway}")
        server_env = env | {"PREFECT_SERVER_API_AUTH_STRING": auth}
        server = stack.enter_context(
            background(
                ["prefect", "server", "start", "--host", gateway, "--port", str(port)],
                work / "prefect-server.log", server_env,
            )
        )  # fmt: skip
        os.environ.update(env)  # this process's Prefect client: the same server and auth
        from prefect import get_client

        client = stack.enter_context(get_client(sync_client=True))
        wait_for("the Prefect server", lambda: client.api_healthcheck() is None, 120, server)
        timings.append(("server and Docker API", time.monotonic() - clock))

        clock = time.monotonic()
        repository = make_repository(work, src, env)
        deploy_env = env | {"RLHF_IMAGE_NAME": name, "RLHF_IMAGE_TAG": tag}
        print(run(["rlhf", "deploy", "--gpus", "0"], repository, deploy_env)[-600:])
        hand_over(repository, args.uid, args.gid)
        stack.enter_context(
            background(
                ["prefect", "worker", "start", "--pool", "rlhf-docker", "--name", "ci-worker"],
                work / "prefect-worker.log", env,
            )
        )  # fmt: skip
        nightly = client.read_deployment_by_name("rlhf-pipeline/rlhf-pipeline")
        stage = client.read_deployment_by_name("rlhf-stage/rlhf-stage")
        check(stage.job_variables.get("gpus") == 0, "rlhf deploy --gpus 0: the stages ask for none")
        timings.append(("deploy and worker", time.monotonic() - clock))

        print("\n-- a run of rlhf-pipeline/rlhf-pipeline")
        clock = time.monotonic()
        flow_run, stage_runs = pipeline_run(client, nightly.id, stage.id)
        timings.append(("pipeline through Prefect", time.monotonic() - clock))
        user = f"{args.uid}:{args.gid}"
        owner = partial(in_image, engine, args.image, repository, user)
        expected = owner("dvc", "stage", "list", "--name-only").split()
        for stage_run in stage_runs:
            container = (stage_run.infrastructure_pid or "?").rsplit(":", 1)[-1][:12]
            print(f"  {stage_run.parameters['stage']:<10} {stage_run.name:<24} "
                  f"{stage_run.state.name:<10} container {container}")  # fmt: skip
        check(flow_run.state.is_completed(), f"the pipeline's flow run Completed: "
              f"{flow_run.state.name} {flow_run.state.message or ''}")  # fmt: skip
        order = [s.parameters["stage"] for s in stage_runs]
        in_order = bool(order) and order[0] == "prepare" and order[-1] == "evaluate"
        check(sorted(order) == sorted(expected) and in_order, f"a run per stage ({len(order)})")
        check(all(s.state.is_completed() for s in stage_runs), "every stage's flow run Completed")
        containers = {s.infrastructure_pid for s in stage_runs} | {flow_run.infrastructure_pid}
        check(None not in containers and len(containers) == len(stage_runs) + 1,
              "every stage, and the pipeline, ran in a container of its own")  # fmt: skip
        # a flow run is Completed a moment before its container exits and is removed
        wait_for("no finished container left behind (auto_remove)",
                 partial(no_flow_run_container, engine), 60)  # fmt: skip
        print("  ok: no finished container left behind (auto_remove)")
        experiments = json.loads(owner("dvc", "exp", "show", "--json"))
        recorded = [e for baseline in experiments for e in baseline.get("experiments") or []]
        check(len(recorded) == 1, f"one experiment recorded: {[e.get('name') for e in recorded]}")
        name = recorded[0]["name"]
        owner("dvc", "exp", "apply", name)
        metrics = {
            str(p.relative_to(repository / "metrics"))
            for p in (repository / "metrics").rglob("*.json")
        }
        # collect's and an RL stage's numbers are details (DVC-cached): their headline is evaluate's
        headline = {"sft.json", "rm.json", "dpo.json", "eval/sft.json", "eval/ppo.json"}
        check(headline <= metrics, f"experiment {name}'s metrics: {sorted(metrics)}")
        status = owner("dvc", "status", "--json").strip()
        check(status == "{}", f"its outputs are in the repository's cache: dvc status {status}")
        remote = owner("dvc", "status", "--cloud", "--json").strip()
        check(remote == "{}", f"and in the DVC remote: dvc status --cloud {remote}")
        owner("git", "checkout", "--", ".")

        print(f"\n-- {PARAM_ERROR_KEY}: 0 committed, and a run of rlhf-pipeline/rlhf-pipeline")
        params = repository / "params.yaml"
        values = yaml.safe_load(params.read_text())
        values["data"]["n_train"] = 0
        params.write_text(yaml.safe_dump(values, sort_keys=False))
        owner("git", "commit", "-qam", f"{PARAM_ERROR_KEY}: 0")
        clock = time.monotonic()
        failed, stage_runs = pipeline_run(client, nightly.id, stage.id)
        timings.append(("failing run through Prefect", time.monotonic() - clock))
        message = failed.state.message or ""
        print(f"  {failed.state.name}: {message}")
        check(failed.state.is_failed(), "the run Failed")
        check([s.parameters["stage"] for s in stage_runs] == ["prepare"], "at prepare")
        check("\n" not in message and PARAM_ERROR_KEY in message and "stage prepare" in message,
              "with the stage's one error line as its message")  # fmt: skip
    print("\nPrefect Docker path:")
    for label, seconds in timings:
        print(f"  {label:<28} {seconds:8.1f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CheckFailed as failure:
        print(f"FAILED: {failure}", file=sys.stderr)
        sys.exit(1)
