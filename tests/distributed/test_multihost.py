"""Two "hosts" on one machine: network namespaces joined by a veth pair.

The master (CURVE keys from ``harness cluster keys``, no local worker) runs in namespace A on
10.213.0.1, a worker (``harness cluster join``) in namespace B on 10.213.0.2, and a client in
A creates actors that the master places on B's worker, then steps CartPole in them over the
veth link. Needs root (or CAP_NET_ADMIN) for ``ip netns``; skipped with the reason otherwise.
The namespaces are unique per run and deleted even on failure; every process is ended by pid.
"""

from __future__ import annotations

import csv
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from test_cluster import end_recorded  # same directory: pytest puts it on sys.path

pytestmark = pytest.mark.distributed

MASTER_IP = "10.213.0.1"
WORKER_IP = "10.213.0.2"
PORT = 7450
ROOT = Path(__file__).resolve().parents[2]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    if shutil.which("ip") is None:
        pytest.skip("the 'ip' command (iproute2) is not installed")
    tag = secrets.token_hex(3)
    ns_a, ns_b = f"harness-a-{tag}", f"harness-b-{tag}"
    veth_a, veth_b = f"hva{tag}", f"hvb{tag}"  # interface names: at most 15 characters
    made = _ip("netns", "add", ns_a)
    if made.returncode != 0:
        pytest.skip(f"cannot create network namespaces here: {made.stderr.strip()}")
    try:
        steps = [
            ("netns", "add", ns_b),
            ("link", "add", veth_a, "type", "veth", "peer", "name", veth_b),
            ("link", "set", veth_a, "netns", ns_a),
            ("link", "set", veth_b, "netns", ns_b),
            ("-n", ns_a, "addr", "add", f"{MASTER_IP}/24", "dev", veth_a),
            ("-n", ns_b, "addr", "add", f"{WORKER_IP}/24", "dev", veth_b),
            ("-n", ns_a, "link", "set", veth_a, "up"),
            ("-n", ns_b, "link", "set", veth_b, "up"),
            ("-n", ns_a, "link", "set", "lo", "up"),
            ("-n", ns_b, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                if "Operation not permitted" in done.stderr:
                    pytest.skip(f"ip {' '.join(step)}: {done.stderr.strip()}")
                raise AssertionError(f"ip {' '.join(step)} failed: {done.stderr.strip()}")
        yield ns_a, ns_b
    finally:
        for ns in (ns_a, ns_b):
            _ip("netns", "del", ns)  # takes the veth pair with it
        _ip("link", "del", veth_a)  # in case it never moved into a namespace


def _in(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def _harness(ns: str, *args: str) -> list[str]:
    return _in(ns, sys.executable, "-m", "harness.cli", "cluster", *args)


def _run(
    argv: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)


CLIENT = """
import json, sys, time
import numpy as np
import harness
from harness.errors import HarnessError
from harness_zmq.cli import request_status
from harness_zmq.security import ephemeral_keys, load_keys

address, keys = sys.argv[1], sys.argv[2]


@harness.remote(cpus=1)
class CartPole:
    def __init__(self, seed):
        import gymnasium as gym

        self.env = gym.make("CartPole-v1")
        self.obs, _ = self.env.reset(seed=seed)
        self.seed = seed

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(action)
        if terminated or truncated:
            obs, _ = self.env.reset()
        return obs, reward, terminated or truncated

    def pid(self):
        import os

        return os.getpid()


def policy(obs):
    return int(obs[2] > 0)  # push towards the lean: balances for a few dozen steps


deadline = time.monotonic() + 20
while not request_status(address, load_keys(keys))["workers"]:
    if time.monotonic() > deadline:
        raise SystemExit("the remote worker never joined")
    time.sleep(0.1)

import gymnasium as gym

out = {"steps": 0, "episodes": 0}
with harness.connect(address, keys=keys):
    envs = [CartPole(seed=s) for s in (1, 2)]
    locals_ = [gym.make("CartPole-v1") for _ in envs]
    obs = [e.reset(seed=s)[0] for e, s in zip(locals_, (1, 2))]
    t0 = time.monotonic()
    for _ in range(300):
        futures = [env.step.future(policy(o)) for env, o in zip(envs, obs)]
        for i, (future, local) in enumerate(zip(futures, locals_)):
            remote_obs, reward, done = future.result(timeout=30)
            want, _, term, trunc, _ = local.step(policy(obs[i]))
            if term or trunc:
                want, _ = local.reset()
            assert np.allclose(remote_obs, want), (remote_obs, want)  # the same simulation
            obs[i] = remote_obs
            out["steps"] += 1
            out["episodes"] += int(done)
    out["step_ms"] = (time.monotonic() - t0) / 300 * 1000
    out["pids"] = [env.pid() for env in envs]
    out["status"] = request_status(address, load_keys(keys))
    try:
        # keys of its own (without them it would find the cluster's, recorded on this host)
        harness.connect(address, connect_timeout_s=2, keys=ephemeral_keys())
        out["keyless"] = "admitted"
    except HarnessError as exc:
        out["keyless"] = str(exc)
print("RESULT " + json.dumps(out), flush=True)
"""


def test_actors_on_a_worker_in_another_network_namespace(
    namespaces: tuple[str, str], tmp_path: Path
) -> None:
    ns_a, ns_b = namespaces
    env = dict(os.environ, HARNESS_STATE_DIR=str(tmp_path / "state"))
    keys = tmp_path / "keys"
    address = f"tcp://{MASTER_IP}:{PORT}"
    worker: subprocess.Popen[bytes] | None = None
    worker_log = None
    try:
        assert (
            _run(
                [sys.executable, "-m", "harness.cli", "cluster", "keys", str(keys)], env
            ).returncode
            == 0
        )
        started = _run(
            _harness(
                ns_a,
                "start",
                "--host",
                MASTER_IP,
                "--port",
                str(PORT),
                "--cpus",
                "0",
                "--keys",
                str(keys),
            ),
            env,
        )
        assert started.returncode == 0, started.stderr
        assert f"cluster started at {address}" in started.stdout
        # the master is not reachable from the root namespace at all
        outside = _run(
            [
                sys.executable,
                "-m",
                "harness.cli",
                "cluster",
                "status",
                address,
                "--keys",
                str(keys),
                "--timeout",
                "1",
            ],
            env,
        )
        assert outside.returncode == 2

        worker_log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - closed in finally
        worker = subprocess.Popen(
            _harness(
                ns_b,
                "join",
                address,
                "--cpus",
                "2",
                "--host",
                WORKER_IP,
                "--keys",
                str(keys),
                "--name",
                "remote",
            ),
            env=env,
            stdout=worker_log,
            stderr=subprocess.STDOUT,
        )
        script = tmp_path / "client.py"
        script.write_text(textwrap.dedent(CLIENT))
        client = _run(_in(ns_a, sys.executable, str(script), address, str(keys)), env, timeout=120)
        assert client.returncode == 0, client.stderr
        found = re.search(r"RESULT (.*)", client.stdout)
        assert found, client.stdout
        result = json.loads(found.group(1))
        print(f"MEASURE CartPole step over veth + CURVE, 2 actors: {result['step_ms']:.2f} ms")
        assert result["steps"] == 600 and result["episodes"] >= 1
        status = result["status"]
        (w,) = status["workers"]
        assert w["host"] == WORKER_IP and w["name"] == "remote" and w["alive"]
        assert status["master"]["curve"] is True
        jobs = status["jobs"]
        assert len(jobs) == 2 and {j["worker_id"] for j in jobs} == {w["id"]}
        assert sorted(j["pid"] for j in jobs) == sorted(result["pids"])
        assert "no answer from a harness master" in result["keyless"]
        assert status["master"]["malformed"] == 0

        # short training runs whose actors live on the other "host", over CURVE: acting
        # with their own policies, then through the learner's policy server (the relay binds
        # on 10.213.0.1, so it takes CURVE connections only)
        for inference in ("actor", "central"):
            out = tmp_path / f"runs-{inference}"
            train = _run(
                _in(
                    ns_a,
                    sys.executable,
                    "-m",
                    "harness.cli",
                    "run",
                    str(ROOT / "competitions" / "cartpole"),
                    "--steps",
                    "4096",
                    "--out",
                    str(out),
                    "--no-progress",
                    "--set",
                    "run.actors=2",
                    "--set",
                    f"run.cluster='{address}'",
                    "--set",
                    f"run.cluster_keys='{keys}'",
                    "--set",
                    f"run.inference='{inference}'",
                    "--set",
                    "run.eval_every=0",
                    "--set",
                    "run.eval_episodes=2",
                    "--set",
                    "run.trackers=['csv']",
                ),
                env,
                timeout=180,
            )
            assert train.returncode == 0, train.stderr[-3000:]
            (summary_file,) = out.glob("*/summary.json")
            summary = json.loads(summary_file.read_text())
            assert summary["steps"] >= 4096
            (metrics_file,) = out.glob("*/metrics.csv")
            with metrics_file.open() as f:
                farm = [r for r in csv.DictReader(f) if r.get("farm/received_steps")]
            assert farm and float(farm[-1]["farm/received_steps"]) > 0, "no farm metrics"
            if inference == "central":  # the actors in B acted through the relay in A
                assert float(farm[-1]["farm/inference_remote_requests"]) > 0, farm[-1]

        stopped = _run(_harness(ns_a, "stop", address), env)
        assert stopped.returncode == 0, stopped.stderr
        assert worker.wait(timeout=20) == 0  # the master told the remote worker to stop
        for pid in result["pids"]:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    finally:
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)
        if worker_log is not None:
            worker_log.close()
        end_recorded(Path(env["HARNESS_STATE_DIR"]))
