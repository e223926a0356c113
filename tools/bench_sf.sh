#!/usr/bin/env bash
# Create .venv-sf: Sample Factory 2.1.1, the peer tools/bench_sf.py measures harness against
# on Pong. It needs its own venv: SF 2.1.1 pins gymnasium<1.0 and numpy<2, harness's .venv has
# gymnasium 1.x and numpy 2. Its Atari stack is ale-py 0.8.1 (through shimmy, as SF's
# `atari` extra resolves it), which ships no ROMs: the Pong ROM is imported with
# `ale-import-roms` from the ROM folder of harness's own ale-py in .venv (bash tools/dev.sh
# installs that first).
#
# torch: the same CPU build as constraints.txt's pin (2.13.0, a local CPU wheel here), installed
# FIRST and then held by a constraint, so that SF's `torch>=1.9` cannot pull a multi-GB CUDA
# build. TORCH_SPEC overrides it (e.g. on a machine with another local CPU wheel).
#
#   bash tools/bench_sf.sh                 # idempotent: reuses .venv-sf, installs what is missing
#   SF_VENV=/tmp/sf bash tools/bench_sf.sh # elsewhere
#
# .venv-sf is ignored by git (.gitignore: .venv-*/).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SF_VENV:-${REPO_ROOT}/.venv-sf}"
PY="${PYTHON:-python3}"
HARNESS_PY="${HARNESS_PY:-${REPO_ROOT}/.venv/bin/python}"
TORCH_SPEC="${TORCH_SPEC:-$(grep -E '^torch==' "${REPO_ROOT}/constraints.txt" | head -n1)}"
SF_SPECS=(sample-factory==2.1.1 'gymnasium>=0.27,<1.0' 'numpy<2' 'shimmy[atari]<1.0' ale-py==0.8.1)

die() {
    echo "bench_sf: $*" >&2
    exit 1
}

[[ -n "${TORCH_SPEC}" ]] || die "no 'torch==' pin in ${REPO_ROOT}/constraints.txt; set TORCH_SPEC"
[[ -x "${HARNESS_PY}" ]] || die "${HARNESS_PY} not found: create harness's venv first (bash tools/dev.sh), its ale-py holds the Pong ROM"
ROMS="$("${HARNESS_PY}" -c 'import ale_py, pathlib; print(pathlib.Path(ale_py.__file__).parent / "roms")' 2>/dev/null)" \
    || die "harness's venv has no ale-py: ${HARNESS_PY} -m pip install ale-py (it ships the ROMs)"
[[ -f "${ROMS}/pong.bin" ]] || die "no pong.bin in ${ROMS}: harness's ale-py ships no ROMs?"

if [[ -x "${VENV}/bin/python" ]]; then
    echo "bench_sf: ${VENV} exists, reusing it" >&2
else
    "${PY}" -m venv "${VENV}" || die "'${PY} -m venv ${VENV}' failed (Debian: apt-get install python3-venv)"
fi
PIP=("${VENV}/bin/python" -m pip install --quiet)
HOLD="${VENV}/torch-constraint.txt"
if ! "${VENV}/bin/python" -c 'import torch' 2>/dev/null; then
    "${PIP[@]}" "${TORCH_SPEC}" || die "could not install ${TORCH_SPEC} (a CPU build); set TORCH_SPEC to one pip can find"
fi
"${VENV}/bin/python" -c 'import torch; print(f"torch=={torch.__version__.split(chr(43))[0]}")' >"${HOLD}"
if ! "${VENV}/bin/python" -c 'import sample_factory, sf_examples.atari, gymnasium, ale_py, shimmy' 2>/dev/null; then
    "${PIP[@]}" -c "${HOLD}" "${SF_SPECS[@]}" || die "pip could not install ${SF_SPECS[*]}"
fi
if ! "${VENV}/bin/python" -c 'import ale_py.roms as r; assert r.get_rom_path("pong")' 2>/dev/null; then
    "${VENV}/bin/ale-import-roms" "${ROMS}" >"${VENV}/ale-import-roms.log" 2>&1 \
        || die "ale-import-roms ${ROMS} failed: see ${VENV}/ale-import-roms.log"
fi

"${VENV}/bin/python" - <<'PY' || die "the check of ${VENV} failed (above)"
from importlib.metadata import version

import gymnasium as gym, numpy, torch
from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args  # noqa: F401

env = gym.make("PongNoFrameskip-v4")
env.reset(seed=0)
env.step(0)
env.close()
print(
    f"bench_sf ok: sample-factory {version('sample-factory')}, torch {torch.__version__}, "
    f"gymnasium {gym.__version__}, numpy {numpy.__version__}, Pong ROM imported"
)
PY
