#!/usr/bin/env bash
# The wheels a GPU host without a package index needs for the test suite and the GPU profile:
# DVC and dvclive (the tests and the profile drive real DVC), pexpect (the labeling terminal's
# tests) and everything they need, for CPython 3.12 on x86-64 Linux, into .whl/ (git-ignored;
# about 30 MB). Run it where PyPI is reachable; `benchmarks/gpu.sh setup` installs what the
# host lacks of them into python3's own environment, beside the host's torch. Prefect is not
# among them: its flow tests are skipped there.
#   bash benchmarks/device_wheels.sh [folder]
set -euo pipefail
out=${1:-.whl}
mkdir -p "$out"
target=(--only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform any)
# Hydra's parser runtime (DVC needs it) is published as a source archive only: built here,
# it is pure Python
python3 -m pip wheel -q --no-deps -w "$out" "$(grep '^antlr4-python3-runtime==' constraints.txt)"
python3 -m pip download -q -c constraints.txt "${target[@]}" --find-links "$out" -d "$out" \
    dvc dvclive pexpect "setuptools>=77"
ls "$out" | wc -l | xargs echo "wheels in $out:"
