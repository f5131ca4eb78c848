#!/usr/bin/env bash
# Everything a GPU host checks, in steps that each stop themselves inside ten minutes, logs and
# JSON into $OUT (default gpu-results/; at most four files a step). The host needs python3 with
# torch (2.11 or newer), pytest, transformers and the project's other runtime packages, but no
# package index: first, where PyPI is reachable, `bash benchmarks/device_wheels.sh` fills .whl/
# with DVC, dvclive and pexpect.
#   bash benchmarks/gpu.sh measure        # every speed figure (benchmarks/measure.py), each
#                                         # part's rows kept as measured: about 8 minutes
#   bash benchmarks/gpu.sh quick          # measure in 60% of the step, the CUDA tests in the
#                                         # rest: one ten-minute call, nine minutes
#   bash benchmarks/gpu.sh setup cuda     # the CUDA tests, and the stage tests with every stage
#                                         # of the tiny pipeline on CUDA
#   bash benchmarks/gpu.sh setup suite    # the whole suite on the host's CPUs
#   bash benchmarks/gpu.sh setup bench    # SFT MFU, rollout vs HF generate, one PPO iteration
#   bash benchmarks/gpu.sh setup memory   # the memory preflight's estimates against measured
#                                         # peaks, GPT-2 124M and Qwen3-0.6B at 1,024 tokens
#   bash benchmarks/gpu.sh setup profile  # the GPU profile end to end (examples/gpu.params.yaml,
#                                         # or $PROFILE_PARAMS); again, it resumes a cut-off run
# `setup` installs the wheels and the project (editable) into python3's own environment, beside
# its torch (`measure` runs it first where the project is not importable yet). Prefect is not
# among them, so its flow tests are skipped there. Compiles go to a persistent inductor cache
# ($INDUCTOR_CACHE), so a second call in the same slot reuses the first one's.
set -uo pipefail
out=$(realpath -m "${OUT:-gpu-results}")
profile=/tmp/rlhf-gpu-profile
profile_params=$(realpath "${PROFILE_PARAMS:-examples/gpu.params.yaml}")
limit=${STEP_SECONDS:-540}  # each step stops itself here, inside a ten-minute call
repo=$(pwd)
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export TORCHINDUCTOR_CACHE_DIR=${INDUCTOR_CACHE:-/tmp/rlhf-inductor-cache}
export TORCHINDUCTOR_FX_GRAPH_CACHE=1 TORCHINDUCTOR_AUTOGRAD_CACHE=1
# python3's scripts (dvc, rlhf, torchrun) first: the tests and stages call them by name
PATH="$(dirname "$(python3 -c 'import sys; print(sys.executable)')"):$PATH"
status=0

setup() {
    python3 -m pip install -q --no-index --find-links .whl dvc dvclive pexpect || return 1
    python3 -m pip install -q --no-index --find-links .whl --no-deps -e . || return 1
    python3 - <<'EOF' || return 1
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__)
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(), f"{torch.cuda.mem_get_info()[1] / 2**30:.0f} GiB")
else:
    print("torch sees no CUDA device")
EOF
    dvc --version | xargs echo dvc || return 1
    # the tests' projects are git + DVC repositories, as a user's are
    git --version || echo "no git here: the suite's DVC projects need it; only bench and profile can run"
}

pytest_for() {  # pytest_for LOG SECONDS ARGS...: the suite's way, its summary on stdout
    local log=$1 seconds=$2
    shift 2
    OMP_NUM_THREADS=1 timeout "$seconds" python3 -m pytest -q --dist loadfile \
        --no-loadscope-reorder -p no:cacheprovider "$@" 2>&1 | tee "$log" | tail -30
}

cuda() {
    local deadline=$((SECONDS + limit)) failed=0
    pytest_for "$out/cuda_tests.log" $((limit / 3)) -n 4 tests/gpu/test_cuda.py \
        tests/stages/test_dpo.py tests/unit/models/test_checkpoint.py || failed=1
    RLHF_TEST_DEVICE=cuda pytest_for "$out/stages_on_cuda.log" $((deadline - SECONDS)) -n 4 \
        tests/stages/test_sft.py tests/stages/test_rm_stage.py tests/stages/test_rl_stage.py \
        tests/stages/test_evaluate_stage.py || failed=1
    return $failed
}

suite() {
    # test_docker builds the production image's environment from the package index, with the
    # development machine's tools (hadolint): a host without an index cannot
    pytest_for "$out/suite_cpu.log" "$limit" -n $(( $(nproc) / 2 )) \
        --ignore tests/system/test_docker.py --ignore tests/gpu/test_cuda.py
}

bench() {  # the three benchmarks in full, each on its own: one failing does not stop the rest
    (
        cd benchmarks || exit 1
        failed=0
        for script in sft_mfu rollout_vs_hf ppo_iteration; do
            timeout "$((limit / 3))" python3 "$script.py" --device cuda --out "$out/$script.json" \
                || failed=1
        done
        exit $failed
    ) 2>&1 | tee "$out/bench.log" | grep -v "^Loading\|^Writing"
    return "${PIPESTATUS[0]}"
}

measure() {  # rows in $out/measure.jsonl as measured; the targets in $out/measure.json
    local deadline=$((SECONDS + limit))
    # installed, not just importable from here (the parts run from benchmarks/)
    (cd / && python3 -c "import rlhf" 2> /dev/null) || setup || return 1
    # shellcheck disable=SC2086  # MEASURE_ARGS: more options, e.g. "--device cpu --shape tiny"
    timeout --kill-after=20 $((deadline - SECONDS)) python3 benchmarks/measure.py --device cuda \
        --out-dir "$out" --seconds $((deadline - SECONDS - 30)) ${MEASURE_ARGS:-} 2>&1 \
        | tee "$out/measure.log" | grep -v "^Loading\|^Writing"
    return "${PIPESTATUS[0]}"
}

memory() {
    (
        cd benchmarks || exit 1
        timeout "$limit" python3 pretrained.py --device cuda --out "$out/pretrained.json"
    ) 2>&1 | tee "$out/memory.log"
}

quick() {  # setup, measure within 60% of the step's time, the CUDA tests in the rest
    local deadline=$((SECONDS + limit)) failed=0
    setup || return 1
    limit=$(((deadline - SECONDS) * 60 / 100)) measure || failed=1
    limit=$((deadline - SECONDS)) cuda || failed=1
    return $failed
}

new_profile() {  # a project of its own: the code and the profile's params, moved into place whole
    local staging="$profile.new"
    rm -rf "$staging" && mkdir -p "$staging" || return 1
    if git rev-parse --git-dir > /dev/null 2>&1; then  # a checkout: what git does not ignore
        git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$staging" || return 1
    else  # a copy of the working tree without git, as a GPU host gets it: no outputs in it
        tar -c --exclude=./.whl --exclude=./gpu-results . | tar -x -C "$staging" || return 1
    fi
    cp "$profile_params" "$staging/params.yaml" || return 1
    (
        cd "$staging" || exit 1
        python3 -m rlhf.dvcfile > /dev/null || exit 1  # its RL stages
        if command -v git > /dev/null; then
            git init -q && git add -A \
                && git -c user.name=gpu -c user.email=gpu@localhost commit -qm "the GPU profile"
        else
            dvc config --local core.no_scm true
        fi
    ) || return 1
    mv "$staging" "$profile"
}

profile() {
    [ -d "$profile" ] || new_profile || return 1
    (
        cd "$profile" || exit 1
        local deadline=$((SECONDS + limit))
        echo -e "stage\tseconds" > "$out/stage_seconds.tsv"
        for stage in $(dvc stage list | awk '{print $1}'); do
            local started=$SECONDS left=$((deadline - SECONDS))
            [ "$left" -gt 0 ] || { echo "out of time before $stage: run the step again"; exit 1; }
            # interrupted like Ctrl-C at the deadline, a stage keeps its last save to resume from
            timeout --signal=INT --kill-after=30 "$left" dvc repro "$stage" \
                2>&1 | tee -a "$out/profile.log" | grep -v "^Running\|^$" | tail -3
            [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "stopped in $stage: run the step again"; exit 1; }
            echo -e "$stage\t$((SECONDS - started))" | tee -a "$out/stage_seconds.tsv"
        done
        cp reports/eval.md "$out/eval.md"
        tar czf "$out/metrics.tar.gz" metrics timings
    )
}

for step in "$@"; do
    echo "== $step"
    "$step" || { status=1; echo "== $step failed"; }
done
exit $status
