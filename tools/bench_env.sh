#!/usr/bin/env bash
# Create the benchmark virtualenv .venv-bench: torch (CPU) + the peers harness is measured
# against (stable-baselines3, and sb3-contrib for RecurrentPPO) + harness itself (editable), so
# every framework in a benchmark runs on the same interpreter, torch build and gymnasium. The
# project's .venv never gets the peers: harness must not depend on them.
#
# torch is pinned to exactly 2.13.0 (the local CPU wheel) and installed FIRST: any other spec,
# or letting stable-baselines3 resolve torch by itself, would pull a multi-GB CUDA build. The
# rest goes through constraints.txt, which pins torch too.
#
# Idempotent: an existing .venv-bench is reused and only what is missing is installed.
# FORCE_REINSTALL_HARNESS=1 re-runs `pip install -e .` (after setup.cfg gains a package or an
# entry point). The editable install writes only into .venv-bench plus the git-ignored
# harness.egg-info/ that every editable install regenerates.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${REPO_ROOT}/.venv-bench"
PY="${PYTHON:-python3}"
PIP=("${VENV}/bin/python" -m pip install --quiet)

if [[ -x "${VENV}/bin/python" ]]; then
    echo "bench_env: ${VENV} exists, reusing it" >&2
else
    "${PY}" -m venv "${VENV}"
fi
if ! "${VENV}/bin/python" -c 'import torch' 2>/dev/null; then
    "${PIP[@]}" torch==2.13.0
fi
if ! "${VENV}/bin/python" -c 'import stable_baselines3, sb3_contrib, gymnasium, tensorboard' 2>/dev/null; then
    # tensorboard: harness's default trackers are csv + tensorboard; without it the "as
    # shipped" harness configuration would silently skip a tracker. sb3-contrib
    # (RecurrentPPO, tools/bench_recurrent.py) is pinned in step with stable-baselines3 in
    # constraints.txt: each sb3-contrib release requires its own stable-baselines3 release.
    "${PIP[@]}" -c "${REPO_ROOT}/constraints.txt" stable-baselines3 sb3-contrib gymnasium tensorboard
fi
rm -f "$("${VENV}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/harness-repo.pth"
if [[ "${FORCE_REINSTALL_HARNESS:-0}" == "1" ]] \
    || ! "${VENV}/bin/python" -c 'import harness, harness_torch, harness_algos, harness_gymnasium' 2>/dev/null; then
    (cd "${REPO_ROOT}" && "${PIP[@]}" -c constraints.txt -e .)
fi

"${VENV}/bin/python" - <<'PY'
import gymnasium, sb3_contrib, stable_baselines3, torch
from harness.plugins import collect_registry, make_plugin_manager
registry = collect_registry(make_plugin_manager())
assert "ppo" in registry.algorithms, "harness plugins not registered (entry points missing?)"
assert torch.__version__.startswith("2.13.0"), f"torch {torch.__version__}: expected the 2.13.0 CPU build"
print(f"bench_env ok: torch {torch.__version__}, stable-baselines3 "
      f"{stable_baselines3.__version__}, sb3-contrib {sb3_contrib.__version__}, "
      f"gymnasium {gymnasium.__version__}, harness plugins ok")
PY
