#!/usr/bin/env bash
# The GPU check: from a clean checkout on a machine with an NVIDIA GPU, in under 8 minutes,
#   1. builds rftkit's environment (.venv, torch from PyPI: a CUDA build on Linux x86_64);
#   2. builds vLLM's GPU build in its own environment (.venv-vllm-gpu);
#   3. writes SmolLM2-135M-Instruct with `rft model smollm2` (or uses DEVICE_CHECK_MODEL=DIR);
#   4. runs a few GRPO steps of the maze with vLLM and the learner sharing GPU 0, both bfloat16,
#      vLLM asleep during each update, and writes bench/results/device_check.json;
#   5. when at least GATEWAY_STAGE_S (150 s) of the budget is left: the gateway over vLLM on the GPU
#      (bench/gateway_overhead.py, tiny model, 16 and 64 clients, 1 and 4 gateway workers on half the
#      host's cores), written to bench/results/gateway_overhead_gpu.json (issue 12's 0.95x target).
# Every stage has a deadline inside one budget (DEVICE_CHECK_BUDGET_S, 480 s) and fails with a
# sentence, never a hang.
#
#   bench/device_check.sh                      # PYTHON=python3.11 to choose the interpreter
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
RUN_DIR=${RUN_DIR:-runs/device-check}
BUDGET_S=${DEVICE_CHECK_BUDGET_S:-480}
started=$SECONDS

fail() {
    echo "device_check: $*" >&2
    exit 1
}

# stage SECONDS NAME COMMAND...: run COMMAND with a deadline; name the stage when it fails.
stage() {
    local limit=$1 name=$2
    shift 2
    local left=$((BUDGET_S - (SECONDS - started)))
    [ "$left" -gt 0 ] || fail "the ${BUDGET_S} s budget was spent before: $name"
    [ "$limit" -le "$left" ] || limit=$left
    echo "=== $name (deadline ${limit} s, $((SECONDS - started)) s so far)"
    local code=0
    timeout --kill-after=15 "$limit" "$@" || code=$?
    if [ "$code" -eq 124 ] || [ "$code" -eq 137 ]; then
        fail "$name did not finish within $limit s"
    elif [ "$code" -ne 0 ]; then
        fail "$name failed (exit code $code); its output is above"
    fi
}

command -v timeout >/dev/null || fail "coreutils' timeout is missing: install coreutils"
command -v nvidia-smi >/dev/null || fail "nvidia-smi is not installed: this check needs an NVIDIA GPU and its driver"
timeout 30 nvidia-smi -L >/dev/null 2>&1 || fail "nvidia-smi sees no GPU (is the driver loaded?)"
command -v "$PYTHON" >/dev/null || fail "$PYTHON not found: set PYTHON to a Python 3.11+ interpreter"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

stage 150 "rftkit environment (.venv, CUDA torch)" bash -c "
    [ -x .venv/bin/python ] || $PYTHON -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[train]'"
.venv/bin/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || fail "torch in .venv has no CUDA ($(.venv/bin/python -c 'import torch; print(torch.__version__)')): install a CUDA build, e.g. .venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cu128"

stage 200 "vLLM GPU build (.venv-vllm-gpu)" bash -c "
    [ -x .venv-vllm-gpu/bin/python ] || $PYTHON -m venv .venv-vllm-gpu
    .venv-vllm-gpu/bin/python -m pip install -q --upgrade pip
    .venv-vllm-gpu/bin/python -m pip install -q vllm"
.venv-vllm-gpu/bin/python -c "import vllm" 2>/dev/null || fail "vLLM does not import in .venv-vllm-gpu"

MODEL=${DEVICE_CHECK_MODEL:-$RUN_DIR/smollm2}
if [ -z "${DEVICE_CHECK_MODEL:-}" ]; then
    .venv/bin/rft model --help >/dev/null 2>&1 \
        || fail "this checkout has no 'rft model smollm2' (issue 9 section 3): set DEVICE_CHECK_MODEL=DIR to a model directory"
    stage 120 "SmolLM2-135M-Instruct (rft model smollm2)" .venv/bin/rft model smollm2 "$MODEL"
fi

stage 240 "GRPO steps on the GPU (vLLM + learner sharing GPU 0)" \
    .venv/bin/python bench/device_check.py --device cuda --model "$MODEL" \
    --vllm-python .venv-vllm-gpu/bin/python --run-dir "$RUN_DIR/run" \
    --stage-timeout-s 150 --out bench/results/device_check.json

GATEWAY_STAGE_S=150
if [ $((BUDGET_S - (SECONDS - started))) -ge "$GATEWAY_STAGE_S" ]; then
    stage "$GATEWAY_STAGE_S" "gateway over vLLM on the GPU (16 and 64 clients, 1 and 4 workers)" bash -c "
        .venv/bin/python -m pip install -q psutil
        RFTKIT_VLLM_PYTHON=.venv-vllm-gpu/bin/python .venv/bin/python bench/gateway_overhead.py \
            --rounds 3 --clients 16 64 --workers 4 --out bench/results/gateway_overhead_gpu.json"
else
    echo "device_check: gateway stage skipped: less than ${GATEWAY_STAGE_S} s of the budget left"
fi

echo "device_check: done in $((SECONDS - started)) s; results in bench/results/"
