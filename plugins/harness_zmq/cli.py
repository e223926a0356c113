"""``harness cluster keys|start|join|status|stop``: the ZeroMQ transport's cluster commands.

``start`` runs a master and one local worker as background processes (their own sessions, so
closing the terminal does not stop them), waits until the master answers, and records their
pids, create times and address in a state file under ``~/.harness/clusters/`` (or
``$HARNESS_STATE_DIR``). ``stop`` asks the master to stop its cluster, then waits for exactly
those recorded processes (and kills them, after checking their create time, if they linger);
other clusters on the host are never touched.

The arguments (and the dispatch of the registered ``cluster`` command) are declared in
:mod:`harness_zmq.command`, which imports no pyzmq. The state files live in
:mod:`harness_zmq.clusters`; asking a master for its status or to stop
in :mod:`harness_zmq.control` (``request_status`` and ``state_dir`` are re-exported here).

Errors are :class:`harness.errors.HarnessError` (the core CLI prints one paragraph and exits 2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness_zmq.clusters import (
    alive,
    keys_for,
    private_state_dir,
    process_record,
    resolve,
    state_dir,
    state_file,
)
from harness_zmq.command import DEFAULT_PORT, DESCRIPTION, add_arguments
from harness_zmq.control import request_status, send_stop

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0

__all__ = ["DEFAULT_PORT", "main", "request_status", "state_dir"]


# ------------------------------------------------------------------------------------------
# argument parsing (the arguments are declared in harness_zmq.command, the CommandSpec)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="harness cluster", description=DESCRIPTION)
    add_arguments(p)
    return p


def main(argv: Sequence[str]) -> int:
    """``harness cluster ARGV`` parsed here (what ``harness cluster`` ran before it became a
    :class:`harness.registry.CommandSpec`); returns the exit code (errors raise HarnessError)."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    return run(args)


def run(args: argparse.Namespace) -> int:
    """``harness cluster COMMAND ...`` with the parsed arguments (the ``CommandSpec``'s run);
    returns the exit code (errors raise :class:`harness.errors.HarnessError`, which the core
    CLI prints as one paragraph)."""
    if args.transport is not None:  # (the core command's option, kept for one release)
        if args.transport != "zmq":
            raise HarnessError(
                f"harness cluster --transport {args.transport}: clusters come with the 'zmq' "
                f"transport only (pip install 'harness[zmq]'); drop --transport."
            )
        print(
            "harness: warning: harness cluster --transport is deprecated and will be removed; "
            "drop it (clusters are the zmq plugin's).",
            file=sys.stderr,
        )
    command = {
        "keys": cmd_keys,
        "start": cmd_start,
        "join": cmd_join,
        "status": cmd_status,
        "stop": cmd_stop,
    }[args.cmd]
    return command(args)


# ------------------------------------------------------------------------------------------
# commands


def cmd_keys(args: argparse.Namespace) -> int:
    from harness_zmq.security import generate_keys

    d = generate_keys(args.dir)
    print(f"CURVE keys written to {d}")
    print(
        f"copy {d} to every host of the cluster and pass --keys {d} to 'harness cluster "
        f"start/join' and keys='{d}' to harness.connect()"
    )
    return 0


def _check_bind(host: str, port: int, what: str, flag: str) -> None:
    """A clear error now rather than from a background process: is the port free?"""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds
        try:
            s.bind((host.strip("[]"), port))
        except OSError as exc:
            if exc.errno == 98:  # EADDRINUSE
                raise HarnessError(
                    f"cannot start {what} on {host}:{port}: the port is already in use "
                    f"(another cluster? see 'harness cluster status'). Pick another with {flag}."
                ) from None
            raise HarnessError(f"cannot start {what} on {host}:{port}: {exc.strerror}.") from None


def _check_start(args: argparse.Namespace) -> Any:
    from harness_zmq.security import is_loopback

    if args.keys is None and not is_loopback(args.host):
        raise HarnessError(
            f"refusing to listen on {args.host!r} without CURVE keys: any host could connect "
            f"and run code. Create keys with 'harness cluster keys DIR', copy DIR to every "
            f"host and pass --keys DIR; or listen on 127.0.0.1 (the default)."
        )
    if args.cpus < 0:
        raise HarnessError(f"--cpus must be >= 0, got {args.cpus:g}")
    if args.heartbeat_s <= 0:
        raise HarnessError(f"--heartbeat-s must be positive, got {args.heartbeat_s:g}")
    keys = keys_for(args.keys, None)
    if args.port != 0:
        _check_bind(args.host, args.port, "a cluster master", "--port")
    if args.monitor_port:
        _check_bind(args.monitor_host, args.monitor_port, "the monitor", "--monitor-port")
    return keys


def _worker_host(host: str) -> str:
    if host in ("0.0.0.0", "*", "::", "[::]"):
        return socket.gethostbyname(socket.gethostname())
    return host


def _master_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--host", args.host, "--port", str(args.port), "--heartbeat-s", str(args.heartbeat_s)]
    if args.keys:
        argv += ["--keys", str(Path(args.keys).expanduser().resolve())]
    if args.monitor_port is not None:
        argv += ["--monitor-port", str(args.monitor_port), "--monitor-host", args.monitor_host]
    return argv


def _worker_argv(args: argparse.Namespace, address: str, keys: Any) -> list[str]:
    host = _worker_host(args.host)
    if host != args.host:  # a wildcard master: join it over the address the actors use (the
        # master accepts actor endpoints only on the address a worker joined from)
        address = f"tcp://{host}:{address.rpartition(':')[2]}"
    argv = [address, "--cpus", f"{args.cpus:g}", "--host", host]
    if args.gpus:
        argv += ["--gpus", args.gpus]
    argv += ["--keys", str(keys.directory)]
    return argv


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    errors = [line for line in text if line.startswith("harness: error:")]
    if errors:
        return errors[-1].removeprefix("harness: error:").strip()
    return "\n".join(text[-lines:])


def _spawn(module: str, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", module, *argv],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def _kill_proc(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def cmd_start(args: argparse.Namespace) -> int:
    keys = _check_start(args)
    if args.foreground:
        return _start_foreground(args, keys)
    d = private_state_dir()
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    master_log = d / f"master-{stamp}.log"
    master = _spawn("harness_zmq.master", _master_argv(args), master_log)
    started: list[subprocess.Popen[bytes]] = [master]
    try:
        address, monitor, keys, token = _await_master(master, master_log, keys)
        worker = None
        worker_log = d / f"worker-{stamp}.log"
        if args.cpus > 0:
            worker = _spawn("harness_zmq.worker", _worker_argv(args, address, keys), worker_log)
            started.append(worker)
            _await_worker(address, keys, worker, worker_log)
        state = {
            "address": address,
            "monitor": monitor,
            "keys": str(keys.directory),
            "started": time.time(),
            "processes": [process_record(master.pid, "master")]
            + ([process_record(worker.pid, "worker")] if worker is not None else []),
            "logs": [str(master_log)] + ([str(worker_log)] if worker is not None else []),
        }
        path = state_file(address)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(path)
    except BaseException:
        for proc in started:
            _kill_proc(proc)
        raise
    print(f"cluster started at {address}")
    if args.keys is None:
        print(f"its CURVE keys (clients on this host find them): {keys.directory}")
    if monitor:
        print(f"monitor at {monitor}")
    if token:
        print(f"monitor token (also in {keys.directory}/monitor.token): {token}")
        print(f"open {monitor}?token={token} once, or send 'Authorization: Bearer TOKEN'")
    print(f"connect with harness.connect({address!r}); stop with 'harness cluster stop {address}'")
    return 0


def _await_master(
    master: subprocess.Popen[bytes], log_path: Path, keys: Any
) -> tuple[str, str | None, Any, str | None]:
    """Wait until the master process prints its address and answers a status request; its
    address, monitor URL, keys (the ones it wrote when it was given none) and monitor token."""
    deadline = time.monotonic() + START_TIMEOUT_S
    address = monitor = None
    while time.monotonic() < deadline:
        if master.poll() is not None:
            raise HarnessError(
                f"the cluster master did not start: {_tail(log_path)} (log: {log_path})"
            )
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        found = re.search(r"harness cluster master at (\S+)", text)
        if found:
            address = found.group(1)
            url = re.search(r"monitor at (\S+)", text)
            monitor = url.group(1) if url else None
            token = re.search(r"monitor token: (\S+)", text)
            try:
                found_keys = keys or keys_for(None, None, address)
                request_status(address, found_keys, timeout=1.0)
                return address, monitor, found_keys, token.group(1) if token else None
            except HarnessError:
                pass
        time.sleep(0.05)
    raise HarnessError(
        f"the cluster master did not answer within {START_TIMEOUT_S:g} s (log: {log_path})"
    )


def _await_worker(address: str, keys: Any, worker: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise HarnessError(
                f"the local worker did not start: {_tail(log_path)} (log: {log_path})"
            )
        status = request_status(address, keys, timeout=1.0)
        if any(w.get("pid") == worker.pid and w.get("alive") for w in status["workers"]):
            return
        time.sleep(0.05)
    raise HarnessError(
        f"the local worker did not register within {START_TIMEOUT_S:g} s (log: {log_path})"
    )


def _start_foreground(args: argparse.Namespace, keys: Any) -> int:
    import logging
    import threading

    from harness_zmq.master import Master

    logging.getLogger("harness_zmq").setLevel(logging.INFO)
    master = Master(
        args.host,
        args.port,
        keys=keys,
        heartbeat_s=args.heartbeat_s,
        monitor_port=args.monitor_port,
        monitor_host=args.monitor_host,
    )
    worker = None
    path = state_file(master.address)
    try:
        if args.cpus > 0:
            argv = _worker_argv(args, master.address, master.keys)
            worker = subprocess.Popen(
                [sys.executable, "-m", "harness_zmq.worker", *argv],
                stdin=subprocess.DEVNULL,
            )
        private_state_dir()
        path.write_text(
            json.dumps(
                {
                    "address": master.address,
                    "monitor": master.monitor_url,
                    "keys": str(master.keys.directory),
                    "started": time.time(),
                    "processes": [process_record(os.getpid(), "master")]
                    + ([process_record(worker.pid, "worker")] if worker is not None else []),
                    "logs": [],
                },
                indent=2,
            )
        )
        print(f"cluster master at {master.address} (Ctrl-C stops it)", flush=True)
        if master.monitor_url:
            print(f"monitor at {master.monitor_url}", flush=True)
        if master.monitor_token:
            print(f"monitor token: {master.monitor_token}", flush=True)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda signum, frame: master.request_stop())
        master.run()  # returns after a stop request, SIGTERM or Ctrl-C
    finally:
        master.close()
        if worker is not None:
            try:
                worker.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _kill_proc(worker)
        with contextlib.suppress(OSError):
            path.unlink()
    return 0


def cmd_join(args: argparse.Namespace) -> int:
    import logging

    from harness_zmq.worker import serve

    logging.getLogger("harness_zmq").setLevel(logging.INFO)
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return serve(args)


def cmd_status(args: argparse.Namespace) -> int:
    address, state = resolve(args.address)
    status = request_status(address, keys_for(args.keys, state, address), timeout=args.timeout)
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return 0
    print(format_status(status, monitor=(state or {}).get("monitor")))
    return 0


def format_status(status: dict[str, Any], monitor: str | None = None) -> str:
    """The status dict as the text table 'harness cluster status' prints."""
    m = status["master"]
    workers = status.get("workers", [])
    alive = [w for w in workers if w.get("alive")]
    used = sum(w.get("cpus_used", 0) for w in alive)
    total = sum(w.get("cpus", 0) for w in alive)
    jobs = status.get("jobs", [])
    lines = [
        f"cluster {m['address']}  harness {m['version']} (protocol {m['protocol']})  "
        f"curve {'on' if m.get('curve') else 'off'}  up {_duration(m.get('uptime_s', 0))}",
    ]
    if monitor:
        lines.append(f"monitor {monitor}")
    lines.append(
        f"workers {len(alive)}/{len(workers)} alive   CPUs used {used:g}/{total:g}   "
        f"jobs {len(jobs)}   clients {len(status.get('clients', []))}   "
        f"pending {status.get('queues', {}).get('pending_spawns', 0)}   "
        f"malformed {m.get('malformed', 0)}   refused {m.get('refused', 0)}"
    )
    rows = [
        ["WORKER", "HOST", "PID", "STATE", "CPUS", "GPUS", "ACTORS", "CPU%", "MEM MB", "HEARTBEAT"]
    ]
    for w in workers:
        rows.append(
            [
                str(w["id"]),
                str(w["host"]),
                str(w["pid"]),
                "alive" if w.get("alive") else "DEAD",
                f"{w.get('cpus_used', 0):g}/{w.get('cpus', 0):g}",
                str(w.get("gpus", 0)),
                str(w.get("actors", 0)),
                f"{w.get('cpu_percent', 0):.0f}",
                f"{w.get('memory_mb', 0):.0f}",
                f"{w.get('last_heartbeat_s', 0):.1f}s ago",
            ]
        )
    lines += ["", *_table(rows)] if workers else ["", "no workers"]
    clients = status.get("clients", [])
    if clients:
        rows = [["CLIENT", "HOST", "PID", "ACTORS", "CONNECTED", "STEPS/S"]]
        for c in clients:
            rows.append(
                [
                    str(c["id"]),
                    str(c["host"]),
                    str(c["pid"]),
                    str(c.get("actors", 0)),
                    _duration(c.get("connected_s", 0)),
                    f"{c.get('metrics', {}).get('steps_per_s', 0):.1f}",
                ]
            )
        lines += ["", *_table(rows)]
    if jobs:
        rows = [["ACTOR", "CLIENT", "WORKER", "PID", "CPUS", "STATE"]]
        for j in jobs[:50]:
            rows.append(
                [
                    str(j["actor_id"]),
                    str(j["client_id"]),
                    str(j["worker_id"]),
                    str(j["pid"]),
                    f"{j.get('cpus', 0):g}",
                    str(j["state"]),
                ]
            )
        lines += ["", *_table(rows)]
        if len(jobs) > 50:
            lines.append(f"... and {len(jobs) - 50} more jobs (--json shows all)")
    return "\n".join(lines)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{seconds:.0f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s // 60 % 60:02d}m"


def cmd_stop(args: argparse.Namespace) -> int:
    address, state = resolve(args.address)
    keys = keys_for(args.keys, state, address)
    try:
        request_status(address, keys)
        answered = True
    except HarnessError as exc:
        if state is None:
            raise
        answered = False
        print(f"harness: warning: {exc}", file=sys.stderr)
    if answered:
        send_stop(address, keys)
    if state is None:  # started elsewhere: wait until the master stops answering
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                request_status(address, keys, timeout=0.5)
            except HarnessError:
                print(f"cluster at {address} stopped")
                return 0
            time.sleep(0.1)
        raise HarnessError(
            f"the master at {address} is still answering {STOP_TIMEOUT_S:g} s "
            f"after the stop request."
        )
    killed = _end_processes(state.get("processes", []), graceful=answered)
    with contextlib.suppress(OSError):
        Path(state["_path"]).unlink()
    note = f" (killed lingering pids {', '.join(map(str, killed))})" if killed else ""
    print(f"cluster at {address} stopped{note}")
    return 0


def _end_processes(records: list[dict[str, Any]], *, graceful: bool) -> list[int]:
    """Wait for the recorded processes to exit; SIGKILL those that linger, but only after
    checking that the pid still belongs to the recorded process (its create time)."""
    deadline = time.monotonic() + (STOP_TIMEOUT_S if graceful else 0.0)
    pending = [r for r in records if alive(r)]
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = [r for r in pending if alive(r)]
    killed = []
    for record in pending:
        if alive(record):  # checks pid + create time right before the signal
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(record["pid"]), signal.SIGKILL)
                killed.append(int(record["pid"]))
    return killed
