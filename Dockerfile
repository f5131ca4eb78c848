# rlhf-pipeline for GPU hosts: the base image's CUDA PyTorch, the project and its runtime
# dependencies (through constraints.txt) in a virtualenv, run under tini as a non-root user on the
# DVC repository mounted at /workspace.
#   docker build -t rlhf-pipeline:latest .
#   docker run --gpus all -v "$PWD":/workspace rlhf-pipeline:latest run
#   docker run --gpus all -e RLHF_NPROC=auto --shm-size 8g -v "$PWD":/workspace \
#     --entrypoint dvc rlhf-pipeline:latest repro   # training stages on every GPU of the host
# Build args: UID/GID (default 1000) own what the container writes to the mounted repository;
# EXTRAS (default hf) names the pyproject extras to install, e.g. EXTRAS=hf,docker for
# prefect-docker where pyproject.toml defines a `docker` extra; EXTRA_PACKAGES adds requirements
# (still under constraints.txt), e.g. dvc-s3 or dvc-gs: constraints.txt pins DVC's HTTP remote
# only, an S3 or GCS remote needs its plugin; PREFETCH_GPT2_ENCODING=true stores tiktoken's gpt2
# file in the image. Nothing secret is baked in: the DVC remote's credentials come from the
# environment at run time (docker run -e AWS_ACCESS_KEY_ID -e AWS_SECRET_ACCESS_KEY, or
# -e GOOGLE_APPLICATION_CREDENTIALS=/path/in/container with the key file mounted there).
# BASE_IMAGE must ship torch 2.13.0 (what constraints.txt pins): the virtualenv sees the base
# Python's packages, so pip keeps its CUDA torch; with any other torch the build stops.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime

FROM ${BASE_IMAGE} AS builder
ENV VIRTUAL_ENV=/opt/venv \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv --system-site-packages "$VIRTUAL_ENV"
ENV PATH="$VIRTUAL_ENV/bin:$PATH"
WORKDIR /opt/rlhf-pipeline

# Dependencies first, from pyproject.toml alone, so that changing the code or the README reuses
# this layer: an empty package stands in for rlhf/ and is uninstalled again. The base's torch,
# exact version, is one more constraint: pip cannot replace it with a download.
COPY pyproject.toml constraints.txt ./
ARG EXTRAS=hf
RUN python -c "import torch; print(f'torch=={torch.__version__}')" > base-torch.txt \
    && mkdir rlhf && touch rlhf/__init__.py README.md \
    && pip install -c constraints.txt -c base-torch.txt ".${EXTRAS:+[$EXTRAS]}" \
    && pip uninstall -y rlhf-pipeline \
    && rm -rf rlhf README.md build ./*.egg-info

# EXTRA_PACKAGES is a list of requirements, split into words on purpose.
ARG EXTRA_PACKAGES=
RUN if [ -n "$EXTRA_PACKAGES" ]; then \
        pip install -c constraints.txt -c base-torch.txt $EXTRA_PACKAGES; \
    fi

# --build-arg PREFETCH_GPT2_ENCODING=true stores tiktoken's gpt2 encoding file in the image,
# for `tokenizer.kind: tiktoken` on hosts without network access. The folder stays writable by
# any user (sticky, as /tmp): tiktoken copies every ranks file it loads into it, the `bpe` and
# `bytes` tokenizers' own included, and fails when it cannot.
# TIKTOKEN_CACHE_DIR names tiktoken's file cache, not a secret.
# hadolint ignore=DL3064
ENV TIKTOKEN_CACHE_DIR=/opt/tiktoken-cache
ARG PREFETCH_GPT2_ENCODING=false
RUN mkdir -p "$TIKTOKEN_CACHE_DIR" \
    && if [ "$PREFETCH_GPT2_ENCODING" = "true" ]; then \
        python -c "import tiktoken; tiktoken.get_encoding('gpt2')"; \
    fi \
    && chmod -R a+rX "$TIKTOKEN_CACHE_DIR" \
    && chmod 1777 "$TIKTOKEN_CACHE_DIR"

# The code last, installed from the wheel built of it (not editable), then a smoke test.
COPY README.md ./
COPY rlhf ./rlhf
RUN pip install --no-deps -c constraints.txt . \
    && rlhf --help > /dev/null

FROM ${BASE_IMAGE} AS runtime
# git: DVC reads the mounted repository; openssh-client lets a scheduled run fetch from an SSH
# remote (mount the keys). tini, as PID 1, passes signals on to the whole process group (-g:
# `docker stop` reaches DVC and the training process, not only `rlhf`) and reaps the processes
# DVC and Prefect leave; no `docker run --init` needed. Versions follow the base image's release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git openssh-client tini \
    && rm -rf /var/lib/apt/lists/*

# Files written to the mounted repository belong to UID:GID; build with
# --build-arg UID="$(id -u)" --build-arg GID="$(id -g)" to make them yours. Ubuntu 24.04 bases
# have a user `ubuntu` with uid 1000, removed here; --non-unique accepts an id another account
# or group already has. tiktoken's cache is made here, writable by any user (see the builder):
# COPY --from fills it but need not keep the folder's own mode (podman's does not).
ARG UID=1000
ARG GID=1000
RUN if id -u ubuntu > /dev/null 2>&1; then userdel --remove ubuntu; fi \
    && groupadd --non-unique --gid "$GID" rlhf \
    && useradd --non-unique --create-home --uid "$UID" --gid "$GID" rlhf \
    && git config --system --add safe.directory /workspace \
    && mkdir -m 1777 /opt/tiktoken-cache

# TIKTOKEN_CACHE_DIR names tiktoken's file cache, not a secret.
# hadolint ignore=DL3064
ENV VIRTUAL_ENV=/opt/venv \
    PATH="/opt/venv/bin:$PATH" \
    PYTHONUNBUFFERED=1 \
    TIKTOKEN_CACHE_DIR=/opt/tiktoken-cache \
    MPLCONFIGDIR=/tmp/matplotlib \
    DVC_NO_ANALYTICS=1
COPY --from=builder /opt/tiktoken-cache /opt/tiktoken-cache
COPY --from=builder /opt/venv /opt/venv

USER ${UID}:${GID}
WORKDIR /workspace
ENTRYPOINT ["/usr/bin/tini", "-g", "--", "rlhf"]
CMD ["--help"]
