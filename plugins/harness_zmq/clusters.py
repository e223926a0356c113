"""The clusters ``harness cluster start`` started on this host: their state files under
``~/.harness/clusters/`` (or ``$HARNESS_STATE_DIR``), the processes recorded there, the key
directory a master started without ``--keys`` writes there (:func:`key_dir`: the state
directory is 0700, the secret files 0600), and finding the cluster a command means (its
address, keys and record).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

from harness.errors import HarnessError

__all__ = [
    "alive",
    "check_address",
    "cluster_keys",
    "key_dir",
    "keys_for",
    "process_record",
    "read_states",
    "resolve",
    "state_dir",
    "state_file",
]


def state_dir() -> Path:
    """Where ``start`` records its clusters: ``$HARNESS_STATE_DIR`` or ``~/.harness/clusters``."""
    env = os.environ.get("HARNESS_STATE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".harness" / "clusters"


def private_state_dir() -> Path:
    """:func:`state_dir`, created mode 0700 (it holds key directories and tokens)."""
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(OSError):  # (one made by an older version, or shared on purpose)
        d.chmod(0o700)
    return d


def _name(address: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", address.removeprefix("tcp://")).strip("_")


def state_file(address: str) -> Path:
    return state_dir() / f"{_name(address)}.json"


def key_dir(address: str) -> Path:
    """Where a master at ``address`` started without ``--keys`` writes its key directory."""
    return state_dir() / f"{_name(address)}.keys"


def cluster_keys(address: str) -> Any:
    """The keys of the cluster at ``address`` as this host recorded them (its start wrote
    them, or its state file names a ``--keys`` directory); a clear error when none are."""
    from harness_zmq.security import load_keys

    check_address(address)
    for state in read_states():
        if state["address"] == address and state.get("keys"):
            return load_keys(state["keys"])
    d = key_dir(address)
    if (d / "server.key_secret").exists():
        return load_keys(d)
    raise HarnessError(
        f"no CURVE keys are recorded for the cluster at {address} in {state_dir()} (every "
        f"cluster authenticates its peers, loopback included). Pass the cluster's key "
        f"directory: --keys DIR, run.cluster_keys=DIR or harness.connect(address, keys=DIR); "
        f"a cluster started on this host without --keys keeps its keys in {d}."
    )


def read_states() -> list[dict[str, Any]]:
    states = []
    d = state_dir()
    for path in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(state, dict) and isinstance(state.get("address"), str):
            state["_path"] = str(path)
            states.append(state)
    return states


def alive(record: dict[str, Any]) -> bool:
    """The recorded process still runs (same pid and create time, not a zombie)."""
    import psutil

    try:
        proc = psutil.Process(int(record["pid"]))
        if abs(proc.create_time() - float(record["create_time"])) > 0.01:
            return False  # the pid was reused by another process
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def process_record(pid: int, role: str) -> dict[str, Any]:
    import psutil

    return {"role": role, "pid": pid, "create_time": psutil.Process(pid).create_time()}


def resolve(address: str | None) -> tuple[str, dict[str, Any] | None]:
    """The address to talk to and its state record (None for a cluster started elsewhere)."""
    states = read_states()
    if address is not None:
        check_address(address)
        for state in states:
            if state["address"] == address:
                return address, state
        return address, None
    live = []
    for state in states:
        if any(alive(p) for p in state.get("processes", [])):
            live.append(state)
        else:  # a cluster that ended without 'stop' (a reboot, kill -9): forget it
            with contextlib.suppress(OSError):
                Path(state["_path"]).unlink()
    if len(live) == 1:
        return live[0]["address"], live[0]
    if not live:
        raise HarnessError(
            f"no running cluster is recorded in {state_dir()}: pass its ADDRESS "
            f"(tcp://HOST:PORT) or start one with 'harness cluster start'."
        )
    names = ", ".join(s["address"] for s in live)
    raise HarnessError(f"several clusters run on this host ({names}): pass one as ADDRESS.")


def check_address(address: str) -> tuple[str, int]:
    from harness_zmq.security import host_of

    host = host_of(address).strip("[]")
    port_text = address.rpartition(":")[2]
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise HarnessError(f"address {address!r} has no valid port: use tcp://HOST:PORT")
    return host, int(port_text)


def keys_for(
    args_keys: str | None, state: dict[str, Any] | None, address: str | None = None
) -> Any:
    """The keys a command uses: ``--keys``, else the state record's, else the key directory
    a master at ``address`` wrote on this host; None when there are none."""
    from harness_zmq.security import load_keys

    directory = args_keys or (state or {}).get("keys")
    if not directory and address is not None and (key_dir(address) / "server.key_secret").exists():
        directory = str(key_dir(address))
    return load_keys(directory) if directory else None
