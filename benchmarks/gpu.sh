#!/usr/bin/env bash
# Everything a GPU host should check, in one go: the CUDA tests, the tiny pipeline's stage
# tests with every stage on CUDA, and the RL step benchmark at a GPT-2-small size.
# Needs python3 with torch, pytest and the project's runtime packages (no DVC or Prefect:
# the tests that need them are not run here). Logs and JSON go to $OUT (default gpu-results/).
#   bash benchmarks/gpu.sh
set -uo pipefail
out=${OUT:-gpu-results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
status=0
python3 -m pytest -q -s -p no:cacheprovider tests/test_cuda.py "tests/test_dpo.py::test_reference_logprobs_share_the_training_precision" \
    2>&1 | tee "$out/cuda_tests.log" || status=1
RLHF_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider tests/test_sft.py tests/test_rm_stage.py \
    tests/test_rl_stage.py tests/test_dpo.py tests/test_evaluate_stage.py \
    2>&1 | tee "$out/pipeline_on_cuda.log" || status=1
PYTHONPATH=. python3 benchmarks/rl_step.py --device cuda --preset gpu --out "$out/rl_step_gpu.json" \
    2>&1 | tee "$out/rl_step_gpu.log" || status=1
exit $status
