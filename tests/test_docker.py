"""The Dockerfile installs what CI tests: the README's install command, through constraints."""

import re
import subprocess

from conftest import REPO


def readme_install_command() -> str:
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- ci:install -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return re.search(r"pip install [^&\n]+", block).group(0).strip()


def dockerfile() -> str:
    return (REPO / "Dockerfile").read_text()


def test_dockerfile_installs_with_the_readme_command_and_constraints():
    command = readme_install_command()
    assert "-c constraints.txt" in command
    run_lines = re.findall(r"^RUN (.+)$", dockerfile(), flags=re.M)
    assert command in run_lines
    assert re.search(r"^COPY .*constraints\.txt", dockerfile(), flags=re.M)


def test_image_runs_rlhf_as_a_non_root_user_in_the_mounted_repo():
    text = dockerfile()
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, flags=re.M)
    assert re.search(r"^ARG BASE_IMAGE=pytorch/pytorch:2\.13\.0-cuda", text, flags=re.M)
    assert re.findall(r"^USER (\S+)$", text, flags=re.M) == ["1000"]
    assert re.findall(r"^WORKDIR (\S+)$", text, flags=re.M)[-1] == "/workspace"
    assert 'ENTRYPOINT ["rlhf"]' in text
    assert "ARG PREFETCH_GPT2_ENCODING=false" in text


def test_hadolint_is_clean():
    result = subprocess.run(["hadolint", "Dockerfile"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
