#!/usr/bin/env bash
# The CUDA checks of the learner and the farm, run as ONE command on a machine with a GPU, inside
# a 10-minute limit (TOTAL_SECONDS, default 570: every part gets at most what is left, a part
# that fails or runs out of time does not stop the next, one summary at the end):
#
#   1. Pong training frames/s (issue 30): harness IMPALA with central inference (the learner
#      and its policy server in one process, device 'auto' = the GPU) against per-actor CPU
#      acting, and against Sample Factory 2.1.1's APPO with its GPU learner, in one run
#      (tools/bench_sf.py; without SF's wheels: tools/bench_impala.py, harness alone);
#   2. tests/gpu: torch's CUDA learner steps against CPU, mixed precision, pinned staging,
#      device metrics, GPU actors, NVML in the monitor, CartPole learned with a CUDA learner
#      serially and over the farm; the paddle backend's CUDA checks (test_paddle_cuda.py:
#      updates on CUDA match CPU, AMP, pinned copies; they skip where paddle is a CPU build or
#      missing, as on the lent H200's image: paddlepaddle-gpu is too big to carry);
#   3. tools/bench_gpu.py: learner updates/s, CPU against CUDA;
#   4. if time is left, Pong sampling alone (bench_impala.py, learner update skipped): the
#      farm's share of the plain envs, per-actor and central (issue 30's target: >= 85%).
#
#   bash tools/gpu_check.sh prepare    # HERE, with network: wheels for the GPU machine in .whl/
#   bash tools/gpu_check.sh            # THERE: logs and results under $OUT (default /tmp/gpu-check)
#
# The GPU machine has no network and its python3 (3.12, CUDA torch, numpy 2) lacks harness's
# dependencies: `prepare` downloads them as cp312 wheels into .whl/ (pyzmq, gymnasium,
# farama-notifications and ale-py at .venv's versions, plus a wheel of harness itself), and
# Sample Factory's into .whl/sf/ (sample-factory 2.1.1 with gymnasium 0.29.1 and numpy 1.26.4,
# which it pins, ale-py 0.9.1: 0.8.1 has no cp312 wheel, 0.9.1 ships the ROMs). Carry .whl (git
# ignores it, ~35 MB). Here they install into /tmp/site and /tmp/sf-site: SF's runs see the
# image's CUDA torch with its own numpy and gymnasium in front (SF_PYTHONPATH), harness's never.
# SF_GPU=0 skips SF (SF_DEVICE=cpu runs its learner on the CPU: the CPU-only test of this path); PONG_WORKERS x PONG_ENVS (8 x 8) actors/workers x envs, PONG_SECONDS (20).
set -u
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT" || exit 1
PY=${PYTHON:-python3}
WHL=${WHEEL_DIR:-.whl}

prepare() {
    # Wheels for the GPU machine's Python (WHEEL_PY, default 3.12), from this machine's .venv
    # and .venv-sf versions where they exist.
    set -e
    local wpy=${WHEEL_PY:-3.12} host=.venv/bin/python sfpy=.venv-sf/bin/python
    local plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    ver() { "$1" -c "import importlib.metadata as m; print(m.version('$2'))" 2>/dev/null || echo "$3"; }
    dl() {
        local dest=$1
        shift
        "$host" -m pip download -q --no-deps --only-binary=:all: --python-version "$wpy" \
            --implementation cp "${plat[@]}" -d "$dest" "$@"
    }
    rm -rf "$WHL" && mkdir -p "$WHL/sf"
    dl "$WHL" "pyzmq==$(ver $host pyzmq 27.3.0)" "gymnasium==$(ver $host gymnasium 1.4.0)" \
        "farama-notifications==$(ver $host farama-notifications 0.0.6)" \
        "ale-py==$(ver $host ale-py 0.12.1)"
    "$host" -m pip wheel -q --no-deps --no-build-isolation -w "$WHL" . >/tmp/gpu_check_wheel.log 2>&1 \
        || { cat /tmp/gpu_check_wheel.log; return 1; }
    dl "$WHL/sf" sample-factory==2.1.1 gymnasium==0.29.1 numpy==1.26.4 ale-py==0.9.1 \
        "signal-slot-mp==$(ver $sfpy signal-slot-mp 1.0.5)" \
        "faster-fifo==$(ver $sfpy faster-fifo 1.5.2)" \
        "tensorboardX==$(ver $sfpy tensorboardX 2.6.5)" "colorlog==$(ver $sfpy colorlog 6.12.0)" \
        "farama-notifications==$(ver $host farama-notifications 0.0.6)"
    du -sh "$WHL"
    echo "gpu_check prepare: carry $WHL; on the GPU machine run: bash tools/gpu_check.sh"
}

if [[ "${1:-}" == "prepare" ]]; then
    prepare
    exit $?
fi

OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
DEADLINE=$(($(date +%s) + ${TOTAL_SECONDS:-570}))
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
FAILED=0

note() { echo "$*" | tee -a "$SUMMARY"; }

# run_part NAME CAP COMMAND...: COMMAND under `timeout` (its cap, or what is left before the
# deadline), its output in $OUT/NAME.log; its outcome in the summary. Never stops the script.
run_part() {
    local name=$1 cap=$2 left t0 rc
    shift 2
    left=$((DEADLINE - $(date +%s) - 5))
    ((cap > left)) && cap=$left
    if ((cap < 20)); then
        note "$name: skipped (${left}s left before the ${TOTAL_SECONDS:-570}s deadline)"
        return 0
    fi
    t0=$(date +%s)
    timeout -k 10 "$cap" "$@" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    if ((rc == 124 || rc == 137)); then
        note "$name: TIMED OUT after ${cap}s (log: $OUT/$name.log)"
        FAILED=1
    elif ((rc != 0)); then
        note "$name: FAILED, exit $rc after $(($(date +%s) - t0))s (log: $OUT/$name.log)"
        FAILED=1
    else
        note "$name: ok in $(($(date +%s) - t0))s"
    fi
    return "$rc"
}

# --- setup: harness's wheels, then SF's (optional, time-bounded) ---------------------------
if compgen -G "$WHL/*.whl" >/dev/null; then
    run_part install-harness 120 "$PY" -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{
    nvidia-smi -L
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
    "$PY" -c "import paddle; print('paddle', paddle.__version__, 'cuda', paddle.device.is_compiled_with_cuda())" 2>/dev/null \
        || echo "paddle: not installed (the paddle CUDA checks skip)"
} 2>&1 | tee "$OUT/gpu.txt"

SF_OK=0
if [[ "${SF_GPU:-1}" != "0" ]] && compgen -G "$WHL/sf/*.whl" >/dev/null; then
    if run_part install-sf 120 "$PY" -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target /tmp/sf-site "$WHL"/sf/*.whl \
        && run_part check-sf 60 env PYTHONPATH=/tmp/sf-site "$PY" -c "
import ale_py, cv2, gymnasium, numpy, sample_factory, torch
assert gymnasium.__version__ < '1', gymnasium.__version__
gymnasium.make('PongNoFrameskip-v4').reset(seed=0)
print('SF env ok: gymnasium', gymnasium.__version__, 'numpy', numpy.__version__, 'torch',
      torch.__version__, 'cuda', torch.cuda.is_available())"; then
        SF_OK=1
    fi
else
    note "sample factory: skipped (SF_GPU=0 or no .whl/sf: run 'bash tools/gpu_check.sh prepare' where pip reaches PyPI)"
fi

# --- 1. Pong training frames/s: central vs per-actor, vs SF's GPU learner ------------------
W=${PONG_WORKERS:-8}
K=${PONG_ENVS:-8}
S=${PONG_SECONDS:-20}
if ((SF_OK)); then
    run_part pong-train 270 env SF_PYTHONPATH=/tmp/sf-site "$PY" tools/bench_sf.py \
        --sf-python "$PY" --sf-device "${SF_DEVICE:-gpu}" --workers "$W" --envs-per-worker "$K" \
        --seconds "$S" --warmup 5 --no-sf-after --env-seconds 3 --keep "$OUT/sf-logs" \
        || grep -q '^harness ' "$OUT/pong-train.log" || SF_OK=0 # else harness alone below
fi
if ((!SF_OK)); then
    run_part pong-train-harness 200 "$PY" tools/bench_impala.py --learner update \
        --inference actor,central --actors "$W" --envs-per-actor "$K" --seconds "$S" --warmup 5
fi

# --- 2. tests/gpu (torch and paddle CUDA checks) -------------------------------------------
run_part pytest-gpu "${TEST_TIMEOUT:-200}" "$PY" -m pytest -q -m gpu tests/gpu \
    -p no:cacheprovider --timeout 180 -rA

# --- 3. learner updates/s, CPU vs CUDA ------------------------------------------------------
run_part bench-gpu "${BENCH_TIMEOUT:-70}" "$PY" tools/bench_gpu.py \
    --seconds "${BENCH_SECONDS:-1}" --json "$OUT/bench_gpu.json" --markdown "$OUT/bench_gpu.md"

# --- 4. Pong sampling alone, if time is left -------------------------------------------------
run_part pong-sampling 110 "$PY" tools/bench_impala.py --learner skip \
    --inference actor,central --actors "$W" --envs-per-actor "$K" --seconds 10 --warmup 3

# --- summary ---------------------------------------------------------------------------------
{
    echo
    echo "==== gpu_check summary ($(date -u '+%Y-%m-%d %H:%M UTC'))"
    cat "$OUT/gpu.txt"
    cat "$SUMMARY"
    for part in pong-train pong-train-harness pong-sampling; do
        [[ -f "$OUT/$part.log" ]] || continue
        echo
        echo "-- $part"
        grep -E '^(\||command:|bench_)' "$OUT/$part.log"
    done
    if [[ -f "$OUT/pytest-gpu.log" ]]; then
        echo
        echo "-- pytest-gpu"
        grep -E '^(PASSED|FAILED|ERROR|SKIPPED)|(passed|failed|skipped|error)' "$OUT/pytest-gpu.log" | tail -n 40
    fi
    [[ -f "$OUT/bench_gpu.md" ]] && { echo; echo "-- bench-gpu"; cat "$OUT/bench_gpu.md"; }
} | tee "$OUT/report.txt"
exit "$FAILED"
