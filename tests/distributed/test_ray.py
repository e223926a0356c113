"""The ray transport on a real local Ray (``ray.init(num_cpus=4, include_dashboard=False)``,
started once for this module; ``harness.connect(transport="ray")`` then uses it as it is).

Ray binds every interface and advertises the host's outward address, so the tests run in a
private network namespace with only a loopback interface (``unshare -n``, as root): the one
test collected outside it, :func:`test_ray_suite_in_a_private_network_namespace`, runs this
module again in there, reports its result and kills, by PID, whatever is left in the namespace.
Inside:

- it passes the transport conformance check of harness.testing (zmq's is in tests/contract);
- a killed Ray actor surfaces as ActorLost, a released one too, an actor's exception as
  RemoteError with its traceback; a constructor that raises fails the creation;
- an argument repeated across calls (a farm's weights) is put in the object store once;
- a call's future completes however it is watched (result, done, callbacks, wait,
  as_completed);
- a local Ray started from a short-lived thread keeps its daemons; harness tune --transport
  ray runs its trials as Ray actors;
- PPO over a 2-actor farm on Ray solves CartPole, learning from no stale weights and putting
  each weights version in the object store once, not once per actor;
- actors SIGKILLed every few seconds are replaced and every transition is observed once;
- bad input: Ray not installed, an unreachable address, authentication turned off; a peer
  without the cluster's token is refused.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'harness[ray]')")

import harness  # noqa: E402
from harness.plugins import collect_registry, make_plugin_manager  # noqa: E402
from harness.remote import ActorLost, RemoteError, handle_of, release  # noqa: E402
from harness.testing import check_transport  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "competitions" / "cartpole"
IN_NETNS = os.environ.get("HARNESS_TEST_NETNS") == "1"
NETNS_SETUP = "ip link set lo up && ip route add default dev lo src 127.0.0.2"
inside = pytest.mark.skipif(not IN_NETNS, reason="runs in the private network namespace")
pytestmark = pytest.mark.distributed


def _netns_works() -> bool:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    probe = subprocess.run(
        ["unshare", "-n", "sh", "-c", NETNS_SETUP], capture_output=True, timeout=30
    )
    return probe.returncode == 0


def _pids_in(netns: str) -> list[int]:
    own = os.readlink("/proc/self/ns/net")
    if netns == own:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "net") == netns:
                    pids.append(int(entry.name))
    return pids


@pytest.mark.skipif(IN_NETNS, reason="this is the namespace run")
@pytest.mark.heavy(seconds=117)  # CI, 2026-12-05 (tests/conftest.py spreads heavy tests)
def test_ray_suite_in_a_private_network_namespace(tmp_path: Path) -> None:
    if not _netns_works():
        pytest.skip("needs `unshare -n` and iproute2 (root) for a loopback-only namespace")
    marker = tmp_path / "netns"
    code = (
        "import os, pathlib, sys, pytest\n"
        f"pathlib.Path({str(marker)!r}).write_text(os.readlink('/proc/self/ns/net'))\n"
        f"sys.exit(pytest.main([{__file__!r}, '-q', '-p', 'no:cacheprovider', '-x',\n"
        "                       '-k', 'not in_a_private_network_namespace']))\n"
    )
    cmd = ["unshare", "-n", "sh", "-c", NETNS_SETUP + ' && exec "$@"', "sh"]
    proc = subprocess.Popen(
        [*cmd, sys.executable, "-c", code],
        env={**os.environ, "HARNESS_TEST_NETNS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if marker.exists():  # Ray's daemons left in the namespace: ours, ended by PID
            for pid in _pids_in(marker.read_text()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    assert proc.returncode == 0, out[-6000:]
    assert " passed" in summary and "skipped" not in summary, out[-3000:]


@pytest.fixture(scope="module")
def local_ray() -> Any:  # (only inside the namespace: every test using it is @inside)
    """One local Ray for the in-process tests of this module (each start costs ~5 s)."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@harness.remote(cpus=0.5)
class Sim:
    def __init__(self, fail: bool = False) -> None:
        if fail:
            raise KeyError("constructor refused")
        self.seen = 0

    def pid(self) -> int:
        return os.getpid()

    def nbytes(self, payload: dict[str, np.ndarray]) -> int:
        self.seen += 1
        return sum(int(a.nbytes) for a in payload.values())

    def boom(self) -> None:
        raise ZeroDivisionError("on purpose")

    def echo(self, value: Any, delay: float = 0.0) -> Any:
        time.sleep(delay)
        return value

    def tag(self, method: str, cls: int = 0) -> str:  # names the transport uses itself
        return f"{method}:{cls}"


@inside
def test_ray_transport_conforms(local_ray: Any) -> None:
    check_transport(collect_registry(make_plugin_manager()).transports.get("ray"))


@inside
def test_errors_map_to_remote_error_and_actor_lost(local_ray: Any) -> None:
    with harness.connect(transport="ray"):
        sim = Sim()
        with pytest.raises(RemoteError) as err:
            sim.boom()
        assert err.value.remote_type == "ZeroDivisionError"
        assert "on purpose" in err.value.remote_message and "boom" in err.value.remote_traceback

        with pytest.raises(RemoteError) as err:
            Sim(fail=True)
        assert "KeyError" in err.value.remote_type and "constructor refused" in str(err.value)

        os.kill(sim.pid(), signal.SIGKILL)
        with pytest.raises(ActorLost):
            sim.pid()
        with pytest.raises(ActorLost):
            sim.pid.future().result(timeout=60)

        other = Sim()
        release(other)
        with pytest.raises(ActorLost):
            other.pid()


@inside
def test_futures_complete_however_they_are_watched(local_ray: Any) -> None:
    """A call's future completes for result(), exception(), done() polling, callbacks and
    concurrent.futures.wait / as_completed (the transport fetches results lazily)."""
    with harness.connect(transport="ray"):
        sim = Sim()
        assert sim.tag("m", cls=3) == "m:3" and sim.tag(method="k") == "k:0"
        assert handle_of(sim).call("__sizeof__", (), {}) > 0  # a name without a Ray method

        slow = sim.echo.future("late", 1.0)
        with pytest.raises(concurrent.futures.TimeoutError):
            slow.result(timeout=0.05)
        assert slow.result(timeout=60) == "late"
        assert isinstance(sim.boom.future().exception(timeout=60), RemoteError)

        waited = [sim.echo.future(i, 0.05) for i in range(3)]
        done, pending = concurrent.futures.wait(waited, timeout=60)
        assert len(done) == 3 and not pending
        assert sorted(f.result() for f in done) == [0, 1, 2]

        streamed = [sim.echo.future(i) for i in range(5)]
        got = sorted(f.result() for f in concurrent.futures.as_completed(streamed, timeout=60))
        assert got == [0, 1, 2, 3, 4]

        polled = sim.echo.future("polled", 0.1)
        deadline = time.monotonic() + 60
        while not polled.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert polled.done() and polled.result(timeout=0) == "polled"

        seen: list[Any] = []
        called = sim.echo.future("cb", 0.05)
        called.add_done_callback(lambda f: seen.append(f.result()))
        assert called.result(timeout=60) == "cb"
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == ["cb"]


THREAD_STARTED_RAY = """
import os, threading, time, psutil, harness

@harness.remote(cpus=0.5)
class Pid:
    def pid(self):
        return os.getpid()

box = {}
starter = threading.Thread(target=lambda: box.update(conn=harness.connect(transport="ray")))
starter.start(); starter.join()  # the thread that started Ray has ended
time.sleep(2)
daemons = [p for p in psutil.Process().children() if p.name() in ("gcs_server", "raylet")]
print("DAEMONS", sorted(p.name() for p in daemons if p.status() != "zombie"), flush=True)
with box["conn"]:
    print("PID", Pid().pid() > 0, flush=True)
"""


@inside
def test_a_local_ray_started_from_a_thread_outlives_it() -> None:
    """Ray's daemons die with the *thread* that started them (PR_SET_PDEATHSIG); harness tune
    connects from a starter thread, which lost the GCS and, a minute later, the process."""
    proc = subprocess.run(
        [sys.executable, "-c", THREAD_STARTED_RAY],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr[-3000:]
    assert "DAEMONS ['gcs_server', 'raylet']" in proc.stdout, out
    assert "PID True" in proc.stdout and proc.returncode == 0, out


@inside
def test_a_repeated_argument_is_put_once(local_ray: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    puts: list[Any] = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(value) or real_put(value, **kw))
    weights = {"w": np.ones((256, 256), np.float32), "b": np.zeros(256, np.float32)}
    with harness.connect(transport="ray"):
        sims = [Sim() for _ in range(3)]
        futures = [s.nbytes.future(weights) for s in sims for _ in range(2)]
        assert [f.result(timeout=60) for f in futures] == [weights["w"].nbytes + 1024] * 6
        assert len(puts) == 1, "the same weights were copied into the object store per call"
        newer = {k: v + 1 for k, v in weights.items()}
        assert sims[0].nbytes(newer) == weights["w"].nbytes + 1024
        assert len(puts) == 2
        assert sims[0].nbytes({"small": np.ones(4)}) == 32 and len(puts) == 2  # small: inline


@inside
def test_ppo_over_a_ray_farm_solves_cartpole(
    local_ray: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_farm import run_farm

    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(1) or real_put(value, **kw))
    result, rec = run_farm(tmp_path, ["transport='ray'", "actors=2", "num_envs=8", "seed=1"])
    assert result.best_eval >= 475.0, f"PPO over 2 Ray actors: best eval {result.best_eval:.1f}"
    farm = [m for m in rec.metrics if "farm/policy_lag" in m]
    assert farm and farm[-1]["farm/actors"] == 2.0
    assert max(m["farm/policy_lag_max"] for m in farm) == 0.0, "PPO learned from stale weights"
    assert farm[-1]["farm/received_steps"] == rec.final_step == rec.env_steps
    versions = farm[-1]["farm/weights_version"]
    # every rollout request carries the weights; each version reaches the store once
    assert versions >= 5 and len(puts) <= versions + 1, (len(puts), versions)


@inside
def test_killed_ray_actors_are_replaced_and_nothing_is_lost(local_ray: Any, tmp_path: Path) -> None:
    from test_farm import Killer, run_farm

    killer = Killer(every=3.0)
    result, rec = run_farm(
        tmp_path,
        [
            "transport='ray'",
            "algo='random'",
            "env='harness/Delay-v0'",
            "env.kwargs={step_seconds=0.005}",
            "actors=3",
            "num_envs=6",
            "total_steps=10_000_000",
            "max_seconds=30",
            "max_policy_lag=2",
            "eval_every=0",
            "eval_episodes=2",
            "checkpoint_every=0",
        ],
        plugins=(killer,),
    )
    farm = [m for m in rec.metrics if "farm/actor_restarts" in m]
    assert result.stopped_early and killer.kills >= 5, killer.kills
    assert farm[-1]["farm/actor_restarts"] >= killer.kills - 1
    assert farm[-1]["farm/lost_rollouts"] >= 1
    assert farm[-1]["farm/received_steps"] == rec.final_step == rec.env_steps == result.steps


# ------------------------------------------------------------------------------------------
# Bad input and security (separate processes: each has its own Ray, or none)


def harness_cli(
    *args: str, env: dict[str, str] | None = None, prelude: str = "", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    code = f"{prelude}\nimport sys\nfrom harness.cli import main\nsys.exit(main(sys.argv[1:]))"
    with tempfile.TemporaryDirectory() as cwd:  # a refused run's directory is not the repo's
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )


FARM = ["run", str(PACK), "--set", "transport=ray", "--set", "actors=2", "--set", "total_steps=64"]


@inside
def test_missing_ray_names_the_extra() -> None:
    proc = harness_cli(*FARM, prelude="import sys; sys.modules['ray'] = None")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "pip install 'harness[ray]'" in proc.stderr, proc.stderr


@inside
def test_unreachable_ray_address_fails_within_seconds_naming_it() -> None:
    start = time.monotonic()
    proc = harness_cli(*FARM, env={"RAY_ADDRESS": "127.0.0.1:1"})
    assert time.monotonic() - start < 30
    assert proc.returncode == 2, proc.stderr
    assert "'127.0.0.1:1'" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@inside
def test_a_local_ray_without_authentication_is_refused() -> None:
    proc = harness_cli(*FARM, env={"RAY_AUTH_MODE": "disabled"})
    assert proc.returncode == 2, proc.stderr
    assert "RAY_AUTH_MODE=disabled" in proc.stderr and "Traceback" not in proc.stderr
    assert "Started a local Ray" not in proc.stderr, "a Ray was started anyway"


@inside
def test_a_peer_without_the_token_is_refused(local_ray: Any, tmp_path: Path) -> None:
    """A process whose home holds no token (any other host's user) cannot join the local Ray
    the farm uses: nothing it sends is deserialised."""
    gcs = ray.get_runtime_context().gcs_address
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(tmp_path)
    code = (
        "import ray\n"
        "try:\n"
        f"    ray.init(address={gcs!r}, log_to_driver=False)\n"
        "    print('JOINED')\n"
        "except Exception as exc:\n"
        "    print('REFUSED', type(exc).__name__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180
    )
    assert "REFUSED" in proc.stdout and "JOINED" not in proc.stdout, proc.stdout + proc.stderr
    assert "Authentication token is missing or incorrect" in proc.stderr, proc.stderr[-2000:]


@inside
def test_tune_trials_as_ray_actors(tmp_path: Path) -> None:
    """harness tune --jobs 2 --transport ray: the trials overlap in two Ray actors, none in
    the tune process, all COMPLETE in the shared SQLite storage. (The tune CLI connects from a
    starter thread: this once lost Ray's GCS, see the test above.)"""
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from test_tune import test_two_jobs_run_concurrently_on_the_local_farm

    if ray.is_initialized():
        ray.shutdown()  # the CLI starts (and stops) its own local Ray, as a user's would
    test_two_jobs_run_concurrently_on_the_local_farm(tmp_path, transport="ray")
