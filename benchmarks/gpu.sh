#!/usr/bin/env bash
# Everything a GPU host checks, in steps that each end well inside ten minutes, logs and JSON
# into $OUT (default gpu-results/). The host needs python3 with torch (2.11 or newer), pytest,
# transformers and the project's other runtime packages but no package index: first, where PyPI
# is reachable, `bash benchmarks/device_wheels.sh` fills .whl/ with DVC, dvclive and pexpect.
#   bash benchmarks/gpu.sh setup tests   # the suite on the host's CPU, then its CUDA tests and
#                                        # the stage tests with every stage on CUDA
#   bash benchmarks/gpu.sh setup bench   # SFT MFU, rollout vs HF generate, one PPO iteration
#   bash benchmarks/gpu.sh setup profile # the GPU profile end to end (examples/gpu.params.yaml,
#                                        # or $PROFILE_PARAMS); run it again to resume where a
#                                        # cut-off run stopped
# `setup` installs the wheels and the project (editable) into python3's own environment, beside
# its torch; Prefect is not among them, so the flow tests are skipped there.
set -uo pipefail
out=$(realpath -m "${OUT:-gpu-results}")
profile=/tmp/rlhf-gpu-profile
profile_params=$(realpath "${PROFILE_PARAMS:-examples/gpu.params.yaml}")
repo=$(pwd)
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# python3's scripts (dvc, rlhf, torchrun) first: the tests and stages call them by name
PATH="$(dirname "$(python3 -c 'import sys; print(sys.executable)')"):$PATH"
status=0

setup() {
    python3 -m pip install -q --no-index --find-links .whl dvc dvclive pexpect || return 1
    python3 -m pip install -q --no-index --find-links .whl --no-deps -e . || return 1
    python3 - <<'EOF'
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__)
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(), f"{torch.cuda.mem_get_info()[1] / 2**30:.0f} GiB")
else:
    print("torch sees no CUDA device")
EOF
    git --version
    dvc --version | xargs echo dvc
}

tests() {
    local workers=$(( $(nproc) / 2 )) failed=0
    # test_docker builds the production image's environment from the package index, with
    # the development machine's tools (hadolint): a host without an index cannot
    OMP_NUM_THREADS=1 python3 -m pytest -q -n "$workers" --dist loadfile -p no:cacheprovider \
        --ignore tests/test_docker.py 2>&1 | tee "$out/suite_cpu.log" | tail -25 || failed=1
    RLHF_TEST_DEVICE=cuda python3 -m pytest -q -n 4 --dist loadfile -p no:cacheprovider \
        tests/test_cuda.py tests/test_dpo.py tests/test_sft.py tests/test_rm_stage.py \
        tests/test_rl_stage.py tests/test_evaluate_stage.py tests/test_checkpoint.py \
        2>&1 | tee "$out/suite_cuda.log" | tail -25 || failed=1
    return $failed
}

bench() {
    cd benchmarks || return 1
    python3 sft_mfu.py --device cuda --out "$out/sft_mfu.json" \
        && python3 rollout_vs_hf.py --device cuda --out "$out/rollout_vs_hf.json" \
        && python3 ppo_iteration.py --device cuda --out "$out/ppo_iteration.json"
    cd "$repo" || return 1
}

profile() {
    if [ ! -d "$profile" ]; then  # a project of its own: the code, the profile's params
        mkdir -p "$profile"
        if git rev-parse --git-dir > /dev/null 2>&1; then  # a checkout: what git does not ignore
            git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$profile"
        else  # a copy of the working tree without git, as a GPU host gets it: no outputs in it
            tar -c --exclude=./.whl --exclude=./gpu-results . | tar -x -C "$profile"
        fi
        cp "$profile_params" "$profile/params.yaml"
        cd "$profile" || return 1
        python3 -m rlhf.stages.dvcfile > /dev/null || return 1  # its RL stages
        if command -v git > /dev/null; then
            git init -q && git add -A && git -c user.name=gpu -c user.email=gpu@localhost \
                commit -qm "the GPU profile"
        else
            dvc config --local core.no_scm true
        fi
    fi
    cd "$profile" || return 1
    echo -e "stage\tseconds" > "$out/stage_seconds.tsv"
    for stage in $(dvc stage list | awk '{print $1}'); do
        local started=$SECONDS
        dvc repro "$stage" 2>&1 | tee -a "$out/profile.log" | grep -v "^Running\|^$" | tail -3
        [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
        echo -e "$stage\t$((SECONDS - started))" | tee -a "$out/stage_seconds.tsv"
    done
    cp reports/eval.md "$out/eval.md"
    tar czf "$out/metrics.tar.gz" metrics timings
    rlhf report
    cd "$repo" || return 1
}

for step in "$@"; do
    echo "== $step"
    "$step" || status=1
done
exit $status
