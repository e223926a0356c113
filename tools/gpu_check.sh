#!/usr/bin/env bash
# The CUDA checks of the learner and the farm, run as one script on a machine with a GPU:
# tests/gpu (CUDA learner steps against CPU, mixed precision, pinned staging, device metrics,
# GPU actors, NVML in the monitor, CartPole learned with a CUDA learner serially and over the
# farm) and tools/bench_gpu.py (learner updates/s, CPU against CUDA).
#
#   bash tools/gpu_check.sh            # logs and results under $OUT (default /tmp/gpu-check)
#
# A machine without harness's dependencies installed can take them as wheels in .whl/ (built
# on a machine with network access, e.g. `pip download pyzmq gymnasium farama-notifications`
# for its Python, plus `pip wheel --no-deps -w .whl .` for harness itself): they are
# installed into /tmp/site first.
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi -L 2>&1 | tee "$OUT/gpu.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" 2>&1 | tee -a "$OUT/gpu.txt"
rc=0
timeout "${TEST_TIMEOUT:-330}" "$PY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider \
    --timeout 300 -rA 2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
timeout "${BENCH_TIMEOUT:-200}" "$PY" tools/bench_gpu.py --seconds "${BENCH_SECONDS:-2}" \
    --json "$OUT/bench_gpu.json" --markdown "$OUT/bench_gpu.md" 2>&1 | tee "$OUT/bench.log"
brc=${PIPESTATUS[0]}
echo "pytest exit $rc, bench exit $brc"
exit $((rc || brc))
