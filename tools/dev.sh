#!/usr/bin/env bash
# One entry point for a fresh machine: creates .venv, installs harness with its extras (torch
# pinned through constraints.txt to the CPU build CI uses), then runs the requested job.
#   bash tools/dev.sh run     -> trains the headline pack (competitions/prosthetics, ~20 min)
#   bash tools/dev.sh run competitions/cartpole   -> another pack (PPO on CartPole, ~1 min)
#   bash tools/dev.sh test    -> format check, lint, types, then the test suite
# Extra arguments after the job name go to `harness run` / pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
job="${1:-test}"
shift || true

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.harness-installed
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip setuptools wheel
  .venv/bin/python -m pip install -q -c constraints.txt -e '.[torch,zmq,dev,myo]'
  # MyoSuite without its declared dependencies: it declares gymnasium<1.3, but its envs build,
  # step and pass gymnasium's check_env on the gymnasium 1.4 harness uses, and one gymnasium
  # serves every env plugin; the [myo] extra above brings what it really imports.
  .venv/bin/python -m pip install -q --no-deps -c constraints.txt myosuite
  touch "$stamp"
fi

case "$job" in
  run)
    pack=competitions/prosthetics
    if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then  # a pack name or path first
      pack="$1"
      shift
    fi
    exec .venv/bin/harness run "$pack" "$@"
    ;;
  test)
    # the web monitor's browser test (Debian package; no-op if present). A failed install does
    # not stop the suite: the browser tests then skip, naming the missing browser.
    bash tools/install_chromium.sh || echo "dev.sh: warning: chromium could not be installed" >&2
    .venv/bin/ruff format --check .
    .venv/bin/ruff check .
    .venv/bin/mypy
    .venv/bin/sphinx-build -E -W --keep-going -q -b html docs/api build/docs-api
    # two pytest-xdist workers, each pinned to its share of the cores (tests/conftest.py);
    # HARNESS_TEST_WORKERS=0 runs the suite in this one process
    exec .venv/bin/python -m pytest -n "${HARNESS_TEST_WORKERS:-2}" --dist worksteal "$@"
    ;;
  *)
    echo "usage: bash tools/dev.sh run|test [args...]" >&2
    exit 2
    ;;
esac
