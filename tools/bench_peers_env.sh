#!/usr/bin/env bash
# Create the peer virtualenvs for tools/bench_remote.py: .venv-parl (PARL 2.2.1) and .venv-ray
# (Ray), each its own venv from python3.11, so neither framework's pins touch the project's
# .venv or .venv-bench (harness is installed into neither peer venv: the harness case runs in
# .venv-bench or .venv). Both get numpy and pyzmq, the same versions as harness's venv, so raw
# pyzmq can be timed in any of the interpreters.
#
# PARL 2.2.1 pins grpcio==1.37.0, pyzmq==22.3.0 and cloudpickle==1.6.0, none of which builds or
# works on Python 3.11, so it is installed with --no-deps and its runtime dependencies are
# installed explicitly (the versions below were found by importing parl, starting a local
# cluster and calling a @parl.remote_class object, sync and wait=False). protobuf must stay
# <= 3.20 (PARL's generated gRPC heartbeat code) and setuptools < 81 (pkg_resources). No deep
# learning backend is needed for PARL's remote objects (parl then logs "No deep learning
# framework was found, but it's ok for parallel computation"), so torch/paddle are not installed.
#
# Idempotent: an existing venv is reused and only what is missing is installed.
# FORCE=1 reinstalls the pinned packages (and PARL itself, re-applying the patch below).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${BENCH_PEERS_DIR:-${REPO_ROOT}}"  # where the venvs go (tools/bench_remote.py looks in the repo root)
PY="${PYTHON:-python3.11}"

COMMON=(numpy==2.4.6 pyzmq==27.3.0 msgpack==1.2.4)
PARL=parl==2.2.1
PARL_DEPS=(
    cloudpickle==3.1.3 grpcio==1.85.3 "protobuf==3.20.0" psutil==7.2.2 termcolor==3.3.0
    click==8.5.1 scipy==1.17.1 six==1.17.0 pynvml==13.0.1 flask==3.1.3 flask-cors==6.0.5
    requests==2.34.2 "setuptools<81"
)
RAY=(ray==2.60.0)

make_venv() {
    local venv="$1"
    if [[ -x "${venv}/bin/python" ]]; then
        echo "bench_peers_env: ${venv} exists, reusing it" >&2
    else
        "${PY}" -m venv "${venv}"
    fi
}

pip_install() {
    local venv="$1"
    shift
    "${venv}/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}

# ---------------------------------------------------------------------------- PARL
VENV="${DEST}/.venv-parl"
make_venv "${VENV}"
if [[ "${FORCE:-0}" == "1" ]] || ! "${VENV}/bin/python" -c \
    'import numpy, zmq, msgpack, cloudpickle, grpc, google.protobuf, scipy, flask, flask_cors, requests, pynvml, psutil, termcolor, click, six' \
    2>/dev/null; then
    # on a re-install pip warns that parl "requires" the old pins: expected, they are
    # replaced on purpose
    if ! out="$(pip_install "${VENV}" "${COMMON[@]}" "${PARL_DEPS[@]}" 2>&1)"; then
        echo "${out}" >&2
        exit 1
    fi
    if [[ -n "${out}" ]]; then
        grep -v "^parl 2.2.1 requires\|dependency resolver\|dependency conflicts" <<<"${out}" >&2 || true
    fi
fi
if [[ "${FORCE:-0}" == "1" ]] || ! "${VENV}/bin/python" -m pip show parl >/dev/null 2>&1; then
    # --force-reinstall under FORCE=1: a fresh copy, so the patch below is applied anew
    pip_install "${VENV}" --no-deps $([[ "${FORCE:-0}" == "1" ]] && echo --force-reinstall) "${PARL}"
fi
# Compatibility patch, outside every timed path. PARL's client runs its job-heartbeat gRPC server
# in a forked process, but creates the grpc.server() object before the fork and starts it in the
# child. grpcio 1.37 (PARL's pin, no Python 3.11 wheels) tolerated that; every grpcio with 3.11
# wheels (1.49 .. 1.85 tried) leaves such a server deaf, so each job misses its client heartbeat,
# asks its worker to kill it ~20-30 s after the actor starts, and the caller then waits forever
# in recv. The patch creates the server inside the child (run()) and keeps the rest: the port is
# still chosen in the parent, which reads it right after start() as before. Heartbeats go every
# 10 s; remote calls never touch this code.
"${VENV}/bin/python" - <<'PY'
import importlib.util
from pathlib import Path

path = Path(importlib.util.find_spec("parl").origin).parent / "remote" / "grpc_heartbeat" / "heartbeat_server.py"
text = path.read_text()
MARK = "# bench_peers_env.sh patch"
if MARK not in text:
    old_init = """        mp.Process.__init__(self)
        self.grpc_server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=500),
            options=[('grpc.max_receive_message_length', -1),
                     ('grpc.max_send_message_length', -1)])
        self.heartbeat_server = GrpcHeartbeatServer(client_count, host_is_alive, dead_job_queue)

        heartbeat_pb2_grpc.add_GrpcHeartbeatServicer_to_server(
            self.heartbeat_server, self.grpc_server)

        with port.get_lock():
            port.value = self.grpc_server.add_insecure_port('[::]:0')
"""
    new_init = """        mp.Process.__init__(self)
        %s: the grpc server is created in run(), after the fork
        # (grpcio >= 1.49 cannot serve from a server created before it); the port is still
        # picked here so that the parent knows it as soon as start() returns
        import socket
        try:
            probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            probe.bind(('::', 0))
        except OSError:  # no IPv6: grpc's '[::]' then means 0.0.0.0 too
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probe.bind(('', 0))
        with probe:
            self._bench_port = probe.getsockname()[1]
        self.heartbeat_server = GrpcHeartbeatServer(client_count, host_is_alive, dead_job_queue)

        with port.get_lock():
            port.value = self._bench_port
""" % MARK
    old_run = """            del os.environ['https_proxy']

        self.grpc_server.start()

        # a life-long while loop
        self.heartbeat_server.timeout_time_mp()
"""
    new_run = """            del os.environ['https_proxy']

        %s: created here, in the child
        self.grpc_server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=500),
            options=[('grpc.max_receive_message_length', -1),
                     ('grpc.max_send_message_length', -1)])
        heartbeat_pb2_grpc.add_GrpcHeartbeatServicer_to_server(
            self.heartbeat_server, self.grpc_server)
        self.grpc_server.add_insecure_port('[::]:%%d' %% self._bench_port)
        self.grpc_server.start()

        # a life-long while loop
        self.heartbeat_server.timeout_time_mp()
""" % MARK
    if text.count(old_init) != 1 or text.count(old_run) != 1:
        raise SystemExit(f"bench_peers_env: {path} is not PARL 2.2.1's; cannot apply the heartbeat patch")
    path.write_text(text.replace(old_init, new_init).replace(old_run, new_run))
    print(f"bench_peers_env: patched {path} (heartbeat server created after fork)")
PY
"${VENV}/bin/python" - <<'PY'
import warnings
warnings.simplefilter("ignore")
import parl, zmq
from parl.remote import remote_class, connect  # noqa: F401  (the API the benchmark uses)
from importlib.metadata import version
print(f"bench_peers_env ok: .venv-parl: parl {version('parl')}, pyzmq {zmq.__version__}, "
      f"grpcio {version('grpcio')}, protobuf {version('protobuf')}")
PY

# ---------------------------------------------------------------------------- Ray
VENV="${DEST}/.venv-ray"
make_venv "${VENV}"
if [[ "${FORCE:-0}" == "1" ]] || ! "${VENV}/bin/python" -c 'import ray, numpy, zmq, msgpack' 2>/dev/null; then
    pip_install "${VENV}" "${COMMON[@]}" "${RAY[@]}"
fi
"${VENV}/bin/python" - <<'PY'
import ray, numpy, zmq
print(f"bench_peers_env ok: .venv-ray: ray {ray.__version__}, numpy {numpy.__version__}, "
      f"pyzmq {zmq.__version__}")
PY
