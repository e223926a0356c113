#!/usr/bin/env bash
# Create the benchmark virtualenv .venv-sb3 for tools/bench_learn.py: torch (CPU) +
# stable-baselines3 + gymnasium + harness itself (editable), so both frameworks run on the
# same interpreter, the same torch build and the same gymnasium CartPole.
#
# torch is pinned to exactly 2.13.0 (the local CPU wheel) and installed FIRST: any other spec,
# or letting stable-baselines3 resolve torch by itself, would pull a multi-GB CUDA build.
# The harness install goes through constraints.txt (which pins torch==2.13.0 too).
#
# Idempotent: an existing .venv-sb3 is reused and only what is missing is installed, so a
# re-run needs no registry access. FORCE_REINSTALL_HARNESS=1 re-runs `pip install -e .` (needed
# after setup.cfg gains a package or an entry point).
#
# The editable install writes only into .venv-sb3 (its own .pth finder and dist-info) plus the
# git-ignored harness.egg-info/ in the repo root, which every editable install regenerates;
# the project's .venv is not touched.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${REPO_ROOT}/.venv-sb3"
PY="${PYTHON:-python3}"
PIP=("${VENV}/bin/python" -m pip install --quiet)

if [[ -x "${VENV}/bin/python" ]]; then
    echo "bench_learn_env: ${VENV} exists, reusing it" >&2
else
    "${PY}" -m venv "${VENV}"
fi

if ! "${VENV}/bin/python" -c 'import torch' 2>/dev/null; then
    "${PIP[@]}" torch==2.13.0
fi
if ! "${VENV}/bin/python" -c 'import stable_baselines3, gymnasium, tensorboard' 2>/dev/null; then
    # -c constraints.txt keeps torch at 2.13.0 whatever stable-baselines3 asks for.
    # tensorboard: harness's default trackers are csv + tensorboard; without it the
    # "as shipped" harness configuration would silently skip a tracker.
    "${PIP[@]}" -c "${REPO_ROOT}/constraints.txt" stable-baselines3 gymnasium tensorboard
fi
if [[ "${FORCE_REINSTALL_HARNESS:-0}" == "1" ]] \
    || ! "${VENV}/bin/python" -c 'import harness, harness_torch, harness_algos, harness_gymnasium' 2>/dev/null; then
    (cd "${REPO_ROOT}" && "${PIP[@]}" -c constraints.txt -e .)
fi

"${VENV}/bin/python" - <<'EOF'
import gymnasium, stable_baselines3, torch
from harness.plugins import collect_registry, make_plugin_manager
registry = collect_registry(make_plugin_manager())
assert "ppo" in registry.algorithms, "harness plugins not registered (entry points missing?)"
print(f"bench_learn_env ok: torch {torch.__version__}, stable-baselines3 "
      f"{stable_baselines3.__version__}, gymnasium {gymnasium.__version__}, harness plugins ok")
EOF
