#!/usr/bin/env bash
# Create the separate benchmark virtualenv .venv-bench (torch CPU + stable-baselines3).
#
# Why a separate venv: the benchmarks compare harness against Stable-Baselines3, which
# the project itself must not depend on. The repo is put on sys.path with a .pth file
# instead of `pip install -e .` so this works even before package metadata exists.
#
# torch is pinned to exactly 2.13.0 (the local CPU wheel) and installed FIRST: any other
# spec, or letting stable-baselines3 resolve torch itself, would pull a multi-GB CUDA build.
#
# Idempotent: an existing .venv-bench is reused; only missing packages are installed.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${REPO_ROOT}/.venv-bench"
PY="${PYTHON:-python3}"

if [[ -x "${VENV}/bin/python" ]]; then
    echo "bench_env: ${VENV} already exists, skipping creation" >&2
else
    "${PY}" -m venv "${VENV}"
fi

# Install only what is missing, so re-running is cheap and needs no registry access.
# pluggy: `import harness` needs it (the core package's only non-numpy import).
if ! "${VENV}/bin/python" -c 'import torch' 2>/dev/null; then
    "${VENV}/bin/python" -m pip install --quiet torch==2.13.0
fi
if ! "${VENV}/bin/python" -c 'import stable_baselines3, gymnasium, numpy, pluggy' 2>/dev/null; then
    "${VENV}/bin/python" -m pip install --quiet stable-baselines3 gymnasium numpy pluggy
fi

# (Re)write the .pth every time: cheap, and keeps it right if the repo moved.
SITE="$("${VENV}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "${REPO_ROOT}" > "${SITE}/harness-repo.pth"

"${VENV}/bin/python" -c 'import torch, stable_baselines3, numpy; print("bench_env ok:", "torch", torch.__version__, "sb3", stable_baselines3.__version__, "numpy", numpy.__version__)'
