"""`rlhf deploy`: the Docker work pool from the shipped template, then `prefect deploy`.

A Docker pool created with `prefect work-pool create --type docker` gets whatever template
the installed prefect-docker ships, without the GPU request or the entrypoint this image
needs; so the pool is created (or brought up to date) from `docker-work-pool.json` first.
`prefect deploy` runs every build and push step in prefect.yaml; where the image is built by
hand (`docker build`) they are dropped from the copy of prefect.yaml handed to it; and where
the host has another GPU count (`--gpus 0` on a host without any), that copy gives it to the
deployments that ask for GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml
from prefect import get_client
from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
from prefect.exceptions import ObjectNotFound

PREFECT_FILE = Path("prefect.yaml")
POOL_TEMPLATE = Path("docker-work-pool.json")
STAGED_PREFECT_FILE = Path(".rlhf") / "prefect.yaml"  # prefect.yaml as this deploy uses it
DOCKER = "docker"


def deployment_env(root: Path) -> dict[str, str]:
    """The environment `prefect deploy` resolves prefect.yaml's `{{ $VAR }}` from, with this
    repository's defaults for the variables the user did not set."""
    defaults = {
        "RLHF_REPOSITORY": str(root.resolve()),
        "RLHF_STORAGE": str((root / ".." / "rlhf-pipeline-storage").resolve()),
        "RLHF_IMAGE_NAME": "rlhf-pipeline",
        "RLHF_IMAGE_TAG": image_tag(root),
    }
    return defaults | dict(os.environ)


def image_tag(root: Path) -> str:
    """The commit's short hash (`-dirty` when a tracked file differs from it), as `.ci/image`
    tags what it builds: a GPU host then runs the image of the code deployed, never a stale
    `latest`; `latest` only outside a git repository."""
    described = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--abbrev=7", "--exclude", "*"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    return described.stdout.strip() if described.returncode == 0 else "latest"


def staged_prefect_file(
    root: Path, config: dict, build: bool, push: bool, gpus: int | None = None
) -> Path:
    """prefect.yaml without the build or push steps this deploy skips, and with `gpus` GPUs
    for each deployment that asks for some (None: as prefect.yaml says)."""
    staged_config = config | {
        "build": config["build"] if build else None,
        "push": config["push"] if push else None,
        "deployments": [with_gpus(d, gpus) for d in config["deployments"]],
    }
    staged = root / STAGED_PREFECT_FILE
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.write_text(yaml.safe_dump(staged_config, sort_keys=False))
    return staged


def with_gpus(deployment: dict, gpus: int | None) -> dict:
    """The deployment with `gpus` GPUs if it asks for any (no `gpus` job variable: the pool's
    default, 1); one that asks for none (the pipeline's orchestration) keeps asking for none.
    None asked for also sets NVIDIA_VISIBLE_DEVICES=void: Docker before 27 reads `--gpus 0`
    as unset."""
    variables = deployment["work_pool"].get("job_variables", {})
    if gpus is None or variables.get("gpus", 1) == 0:
        return deployment
    changed = variables | {"gpus": gpus}
    if gpus == 0:
        changed["env"] = variables.get("env", {}) | {"NVIDIA_VISIBLE_DEVICES": "void"}
    pool = deployment["work_pool"] | {"job_variables": changed}
    return deployment | {"work_pool": pool}


def give_docker_pools_the_template(pools: set[str], template: dict) -> None:
    """Create each pool that does not exist yet as a Docker pool with `template`, and give
    an existing Docker pool that template; a pool of another type is left as it is."""
    with get_client(sync_client=True) as client:
        for pool in sorted(pools):
            try:
                existing = client.read_work_pool(pool)
            except ObjectNotFound:
                client.create_work_pool(
                    WorkPoolCreate(name=pool, type=DOCKER, base_job_template=template)
                )
                continue
            if existing.type == DOCKER:
                client.update_work_pool(pool, WorkPoolUpdate(base_job_template=template))


def deploy(
    root: Path, names: list[str] | None, build: bool, push: bool, gpus: int | None = None
) -> int:
    """Create the Docker pools, then register the deployments; `prefect deploy`'s status."""
    config = yaml.safe_load((root / PREFECT_FILE).read_text())
    deployments = [d for d in config["deployments"] if names is None or d["name"] in names]
    template = json.loads((root / POOL_TEMPLATE).read_text())
    give_docker_pools_the_template({d["work_pool"]["name"] for d in deployments}, template)
    selected = [f"--name={n}" for n in names] if names else ["--all"]
    staged = staged_prefect_file(root, config, build, push, gpus)
    command = ["prefect", "--no-prompt", "deploy", "--prefect-file", str(staged), *selected]
    return subprocess.call(command, cwd=root, env=deployment_env(root))
