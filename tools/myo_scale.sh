#!/usr/bin/env bash
# How the MyoChallenge Die Reorient pack scales over a synchronous ZeroMQ farm on a GPU machine:
# `harness run competitions/myochallenge_2022_die --actors N` (PPO, learner on DEVICE) for a few
# actor counts, each for the same wall-clock seconds, then env steps/s and the shaped return and
# success each reached, in one summary. One command inside a 10-minute limit (TOTAL_SECONDS,
# default 500: every run gets at most what is left; a run that fails does not stop the next).
#
#   bash tools/myo_scale.sh prepare   # HERE, with network: cp312 wheels in .whl-myo/ (~34 MB)
#   bash tools/myo_scale.sh           # THERE: summary in $OUT/summary.txt (default /tmp/myo-scale)
#
# The GPU machine has no network; its python3 (3.12, CUDA torch, numpy 2; pluggy, rich,
# matplotlib, pyyaml, scipy, absl-py, msgpack, cloudpickle, psutil already there) lacks harness
# and what MyoSuite imports. `prepare` downloads those as cp312 manylinux wheels at .venv's
# versions (constraints.txt's myosuite 3.0.0 and myo-sim 0.2.3): pyzmq, gymnasium,
# farama-notifications, mujoco with mujoco-core (its compiled half; mujoco-studio, the 22 MB
# viewer, is never imported by the Die env, so it stays behind), glfw (mujoco imports it even
# headless), termcolor, colorednoise, ml-collections, plus a wheel of harness itself. They
# install with --no-deps, as tools/dev.sh installs myosuite: it declares gymnasium<1.3 and a
# dozen packages its Die env never imports. Carry .whl-myo (git ignores it).
#
# There the wheels go to /tmp/myo-site, and the checkout that travelled is put in front of them
# on PYTHONPATH (its harness/ and plugins/), so the code measured is the working tree's even if
# the harness wheel is older; the wheel supplies the plugins' entry points.
#
# Settings (environment): ACTOR_COUNTS ("4 8 14"); RUN_SECONDS (run.max_seconds of each run,
# default an equal share of TOTAL_SECONDS); ENVS_PER_ACTOR (4: run.num_envs = N x 4, so every
# actor steps the same envs and none waits on a bigger share: 16 envs, the pack's own, at 4
# actors); NUM_ENVS (a fixed run.num_envs instead, e.g. 56 for 4, 8 and 14 actors alike, same
# PPO batch in every run); DEVICE (cuda); EVAL_EPISODES (0: no final greedy evaluation);
# PYTHON (python3); SKIP_INSTALL=1 (use PYTHON's own packages: a local test with .venv);
# RUN_ROOT (the run directories, default /tmp/myo-scale-runs: outside $OUT, which returns at
# most 8 files). $OUT gets summary.txt, die-aN.log and die-aN.csv (the run's metrics.csv).
set -u
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT" || exit 1
PY=${PYTHON:-python3}
WHL=${WHEEL_DIR:-.whl-myo}
SITE=${SITE_DIR:-/tmp/myo-site}

prepare() {
    set -e
    local wpy=${WHEEL_PY:-3.12} host=.venv/bin/python
    local plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    ver() { "$host" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || echo "$2"; }
    rm -rf "$WHL" && mkdir -p "$WHL"
    "$host" -m pip download -q --no-deps --only-binary=:all: --python-version "$wpy" \
        --implementation cp "${plat[@]}" -d "$WHL" \
        "pyzmq==$(ver pyzmq 27.3.0)" "gymnasium==$(ver gymnasium 1.4.0)" \
        "farama-notifications==$(ver farama-notifications 0.0.6)" \
        "mujoco==$(ver mujoco 4.0.1)" "mujoco-core==$(ver mujoco-core 4.0.1)" \
        "glfw==$(ver glfw 2.11.0)" "myosuite==$(ver myosuite 3.0.0)" \
        "myo-sim==$(ver myo-sim 0.2.3)" "termcolor==$(ver termcolor 3.3.0)" \
        "colorednoise==$(ver colorednoise 2.2.0)" "ml-collections==$(ver ml-collections 1.1.0)"
    "$host" -m pip wheel -q --no-deps --no-build-isolation -w "$WHL" . >/tmp/myo_scale_wheel.log 2>&1 \
        || { cat /tmp/myo_scale_wheel.log; return 1; }
    # every wheel installable on the GPU machine's interpreter (tags only: they go in --no-deps)
    "$host" -m pip install -q --dry-run --no-index --no-deps --only-binary=:all: \
        --python-version "$wpy" --implementation cp "${plat[@]}" --target /tmp/myo_scale_dry \
        "$WHL"/*.whl
    local kib
    kib=$(du -sk "$WHL" | cut -f1)
    echo "myo_scale prepare: $(find "$WHL" -name '*.whl' | wc -l) wheels, $((kib / 1024)) MiB in $WHL"
    if ((kib > 60 * 1024)); then
        echo "myo_scale prepare: $WHL is over 60 MiB: too big to carry (64 MiB in all)" >&2
        return 1
    fi
    echo "myo_scale prepare: carry $WHL; on the GPU machine run: bash tools/myo_scale.sh"
}

if [[ "${1:-}" == "prepare" ]]; then
    prepare
    exit $?
fi

OUT=${OUT:-/tmp/myo-scale}
RUN_ROOT=${RUN_ROOT:-/tmp/myo-scale-runs}
TOTAL=${TOTAL_SECONDS:-500}
DEADLINE=$(($(date +%s) + TOTAL))
read -r -a COUNTS <<<"${ACTOR_COUNTS:-4 8 14}"
# an equal share each, less ~45 s a run for actors starting, the last iteration and the exit,
# and ~30 s for the install
SECS=${RUN_SECONDS:-$(((TOTAL - 30) / ${#COUNTS[@]} - 45))}
mkdir -p "$OUT" "$RUN_ROOT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
export PYTHONUNBUFFERED=1
unset MUJOCO_GL # harness runs MuJoCo headless; no env here renders
note() { echo "$*" | tee -a "$SUMMARY"; }

if [[ "${SKIP_INSTALL:-0}" != "1" ]]; then
    compgen -G "$WHL/*.whl" >/dev/null \
        || { note "no wheels in $WHL: run 'bash tools/myo_scale.sh prepare' where pip reaches PyPI, and carry $WHL"; exit 1; }
    timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target "$SITE" "$WHL"/*.whl >"$RUN_ROOT/install.log" 2>&1 \
        || { note "install failed:"; tail -n 20 "$RUN_ROOT/install.log" | tee -a "$SUMMARY"; exit 1; }
    export PYTHONPATH=$REPO_ROOT:$REPO_ROOT/plugins:$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
{
    echo "== myo_scale $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, device ${DEVICE:-cuda};" \
        "actors ${COUNTS[*]}, ${SECS}s each, TOTAL_SECONDS=$TOTAL"
    nvidia-smi -L 2>/dev/null
    timeout 120 "$PY" -c "
import torch, mujoco, myosuite, gymnasium, harness, zmq
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '| mujoco', mujoco.__version__,
      '| gymnasium', gymnasium.__version__, '| harness from', harness.__file__)" 2>&1 | grep -v -i warn
} | tee -a "$SUMMARY"

# summarise RUN_DIR LABEL WALL_SECONDS: one line from its metrics.csv and summary.json
summarise() {
    "$PY" - "$@" <<'EOF'
import csv, json, pathlib, statistics, sys
run, label, wall = pathlib.Path(sys.argv[1]), sys.argv[2], max(float(sys.argv[3]), 1.0)
rows = list(csv.DictReader(open(run / "metrics.csv"))) if (run / "metrics.csv").exists() else []
def last(key):
    vals = [r[key] for r in rows if r.get(key) not in (None, "")]
    return float(vals[-1]) if vals else float("nan")
sps = [float(r["perf/SPS"]) for r in rows if r.get("perf/SPS")]
summ = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
steps = summ.get("steps", max((float(r["step"]) for r in rows), default=0))
loop = summ.get("wall_time", float("nan"))
print(f"{label}: steps {steps:.0f} in {loop:.0f}s ({steps / loop:.0f}/s; {steps / wall:.0f}/s over "
      f"the whole {wall:.0f}s command) | perf/SPS median {statistics.median(sps) if sps else float('nan'):.0f} "
      f"of {len(sps)} rows | return {last('charts/episodic_return'):.1f} score {last('charts/score'):.3f} "
      f"success {last('charts/success'):.3f} episodes {last('charts/episodes'):.0f}")
EOF
}

HARNESS='import sys; from harness.cli import main; sys.exit(main())'
FAILED=0
for A in "${COUNTS[@]}"; do
    name=die-a$A
    envs=${NUM_ENVS:-$((A * ${ENVS_PER_ACTOR:-4}))}
    left=$((DEADLINE - $(date +%s)))
    secs=$SECS
    ((secs > left - 45)) && secs=$((left - 45))
    if ((secs < 20)); then
        note "$name: skipped (${left}s left of TOTAL_SECONDS=$TOTAL)"
        continue
    fi
    ((envs % A)) && note "$name: note: $envs envs do not split evenly over $A actors"
    rm -rf "${RUN_ROOT:?}/$name"
    t0=$(date +%s)
    # harness's console script, run by PY (harness has no __main__)
    timeout -k 10 $((left - 5)) "$PY" -c "$HARNESS" run competitions/myochallenge_2022_die \
        --actors "$A" --no-progress --set run.seed=1 --set run.max_seconds="$secs" \
        --set run.total_steps=100000000 --set run.num_envs="$envs" \
        --set backend.device="${DEVICE:-cuda}" --set run.out="$RUN_ROOT" --set run.name="$name" \
        --set run.eval_every=0 --set run.eval_episodes="${EVAL_EPISODES:-0}" \
        --set run.checkpoint_every=0 --set run.log_every="${LOG_EVERY:-10000}" \
        --set "run.trackers=['csv']" >"$OUT/$name.log" 2>&1
    rc=$?
    wall=$(($(date +%s) - t0))
    cp "$RUN_ROOT/$name/metrics.csv" "$OUT/$name.csv" 2>/dev/null
    if ((rc != 0)); then
        FAILED=1
        note "$name ($A actors, $envs envs, ${secs}s): exit $rc after ${wall}s; log tail:"
        grep -v -E 'WARNING: (Nan|Inertia)|^$' "$OUT/$name.log" | tail -n 8 | tee -a "$SUMMARY"
    fi
    [[ -f "$RUN_ROOT/$name/summary.json" || -f "$RUN_ROOT/$name/metrics.csv" ]] \
        && summarise "$RUN_ROOT/$name" "$name ($A actors, $envs envs, ${secs}s)" "$wall" 2>&1 | tee -a "$SUMMARY"
done
echo "(full logs: $OUT/die-aN.log, metrics: $OUT/die-aN.csv, runs: $RUN_ROOT)" >>"$SUMMARY"
echo "== summary in $SUMMARY"
exit "$FAILED"
