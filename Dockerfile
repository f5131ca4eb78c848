# rlhf-pipeline for GPU hosts: CUDA PyTorch, the project installed through constraints.txt with
# the README's command, run as a non-root user on the DVC repository mounted at /workspace.
#   docker build -t rlhf-pipeline:latest .
#   docker run --gpus all -v "$PWD":/workspace rlhf-pipeline:latest run
# BASE_IMAGE must ship torch 2.13.0 (what constraints.txt pins) so pip keeps its CUDA build.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

# DVC needs git to read the mounted repository; versions follow the base image's release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

# TIKTOKEN_CACHE_DIR names tiktoken's file cache, not a secret.
# hadolint ignore=DL3064
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    TIKTOKEN_CACHE_DIR=/opt/tiktoken-cache \
    MPLCONFIGDIR=/tmp/matplotlib \
    DVC_NO_ANALYTICS=1

WORKDIR /opt/rlhf-pipeline
COPY pyproject.toml constraints.txt README.md ./
COPY rlhf ./rlhf
RUN pip install -c constraints.txt -e '.[dev]'

# --build-arg PREFETCH_GPT2_ENCODING=true stores tiktoken's gpt2 encoding file in the image,
# for `tokenizer.kind: tiktoken` on hosts without network access.
ARG PREFETCH_GPT2_ENCODING=false
RUN mkdir -p "$TIKTOKEN_CACHE_DIR" \
    && if [ "$PREFETCH_GPT2_ENCODING" = "true" ]; then \
        python -c "import tiktoken; tiktoken.get_encoding('gpt2')"; \
    fi \
    && chmod -R a+rX "$TIKTOKEN_CACHE_DIR"

# Files written to the mounted repository belong to uid 1000 (`docker run --user` changes it).
RUN useradd --create-home --uid 1000 rlhf \
    && git config --system --add safe.directory /workspace
USER 1000
WORKDIR /workspace
ENTRYPOINT ["rlhf"]
CMD ["--help"]
