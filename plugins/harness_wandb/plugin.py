"""Registers the ``wandb`` tracker: Weights & Biases runs, online or offline.

Choose it with ``run.trackers = ["csv", "wandb"]``. What it logs:

* the resolved config (``config.to_dict()``) as the W&B run config;
* every metric under its namespace (``charts/``, ``losses/``, ``perf/``, ``eval/``, ``farm/``;
  W&B draws one panel section per prefix) against ``global_step``, the env step;
* system metrics through wandb's own monitor (CPU, memory, and GPUs where NVML finds one;
  without a GPU there is simply no GPU panel);
* at run end, ``learning_curve.png`` as media and ``RUN_DIR/checkpoints`` as a ``model``
  artifact.

The run id is kept in ``RUN_DIR/wandb_run.json``, so ``harness run --resume RUN_DIR`` continues
the same W&B run. ``HARNESS_WANDB_GROUP`` groups runs (``harness tune`` sets it per study);
``WANDB_PROJECT``/``WANDB_ENTITY`` pick the project (default ``harness``). Without an API key, or
when the W&B host is unreachable, the run is recorded offline under ``RUN_DIR/wandb`` and one
warning says how to ``wandb sync`` it. W&B never stops training: wandb runs in a child
process (:mod:`harness_wandb.worker`) fed through a pipe, so its import, start-up and logging
cost the training process almost nothing; the finish is bounded in time, and any failure
disables the tracker with one warning.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import netrc
import os
import queue
import secrets
import socket
import string
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from harness import hookimpl
from harness.checkpoint import write_atomic_text
from harness.errors import MissingExtraError, PluginError
from harness.registry import TrackerSpec

log = logging.getLogger(__name__)

RUN_FILE = "wandb_run.json"
"""Where the W&B run id (and project, group) of a harness run directory is kept."""
DEFAULT_PROJECT = "harness"
STEP_KEY = "global_step"


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        log.warning("%s=%r is not a number; using %g", name, os.environ[name], default)
        return default


def has_api_key(base_url: str) -> bool:
    """Whether W&B credentials exist (``WANDB_API_KEY`` or a netrc entry from ``wandb login``)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(base_url).hostname or ""
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def reachable(base_url: str, timeout: float) -> bool:
    """Whether a TCP connection to the W&B host opens within ``timeout`` seconds."""
    url = urlparse(base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def choose_mode() -> tuple[str, str]:
    """``(mode, why)``: ``WANDB_MODE`` when set, otherwise offline without credentials or
    network, online otherwise."""
    mode = os.environ.get("WANDB_MODE", "").strip()
    if mode:
        return mode, "WANDB_MODE is set"
    base_url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    if not has_api_key(base_url):
        return "offline", "no W&B API key (set WANDB_API_KEY or run `wandb login`)"
    timeout = _env_float("HARNESS_WANDB_PROBE_TIMEOUT", 3.0)
    if not reachable(base_url, timeout):
        return "offline", f"{base_url} is unreachable"
    return "online", "credentials found and the host answers"


def new_run_id() -> str:
    """An 8-character id in W&B's alphabet (lowercase letters and digits)."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def _config_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    return dict(config)


MAX_PENDING_ROWS = 100_000
"""Rows queued for the W&B process before more are dropped (with one warning)."""


class WandbTracker:
    """One W&B run per harness run directory (see the module docstring). wandb itself runs in
    a child process (:mod:`harness_wandb.worker`); this object only queues JSON lines to it."""

    def __init__(self, run_dir: Path, config: Any = None, start_step: int = 0) -> None:
        if importlib.util.find_spec("wandb") is None:
            raise MissingExtraError("wandb", "wandb", "the wandb tracker")
        self.run_dir = Path(run_dir)
        self.last_step = self._start_step = start_step
        self._closed = False
        self._failed = False
        self._dropped = False
        self._finished = threading.Event()
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(MAX_PENDING_ROWS)
        try:
            init = self._init_arguments(config)
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "harness_wandb.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log_file(),
                text=True,
                encoding="utf-8",
                cwd=self.run_dir,
            )
        except Exception as exc:
            raise PluginError(f"W&B could not start ({type(exc).__name__}: {exc})") from exc
        self._queue.put({"init": init, "start_step": start_step, "trainer_pid": os.getpid()})
        self._writer = threading.Thread(
            target=self._write, name="harness-wandb-writer", daemon=True
        )
        self._reader = threading.Thread(target=self._read, name="harness-wandb-reader", daemon=True)
        self._writer.start()
        self._reader.start()

    def _init_arguments(self, config: Any) -> dict[str, Any]:
        saved = self._saved()
        run_id = saved.get("id") or new_run_id()
        project = os.environ.get("WANDB_PROJECT") or saved.get("project") or DEFAULT_PROJECT
        group = os.environ.get("HARNESS_WANDB_GROUP") or saved.get("group") or None
        self._mode, self._why = choose_mode()
        # persisted before init: a crash during start-up still resumes the same run id
        record = {"id": run_id, "project": project, "group": group}
        write_atomic_text(self.run_dir / RUN_FILE, json.dumps(record, indent=2))
        self.run_id = run_id
        cfg = _config_dict(config)
        run_cfg = cfg.get("run", {})
        wandb_dir = Path(os.environ.get("WANDB_DIR") or self.run_dir)
        wandb_dir.mkdir(parents=True, exist_ok=True)
        return {
            "project": project,
            "id": run_id,
            "resume": "allow",
            "name": self.run_dir.name,
            "group": group,
            "tags": [str(run_cfg[k]) for k in ("algo", "env") if k in run_cfg] or None,
            "config": json.loads(json.dumps(cfg, default=str)),
            "dir": str(wandb_dir),
            "mode": self._mode,
        }

    def _log_file(self) -> Any:
        """wandb's own messages (stderr of the W&B process) go to RUN_DIR/wandb/worker.log."""
        path = self.run_dir / "wandb" / "worker.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("a", encoding="utf-8")

    def _saved(self) -> dict[str, Any]:
        path = self.run_dir / RUN_FILE
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else {}
        except ValueError:
            log.warning("%s is not valid JSON; starting a new W&B run", path)
            return {}

    # -- the pipes -------------------------------------------------------------------------
    def _write(self) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    break
                stdin.write(json.dumps(item) + "\n")
                stdin.flush()
        except (OSError, ValueError):  # the W&B process is gone: _read says why
            pass
        finally:
            with contextlib.suppress(OSError, ValueError):
                stdin.close()

    def _read(self) -> None:
        stdout = self._proc.stdout
        assert stdout is not None
        try:
            for line in stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                kind = msg.get("k")
                if kind == "started":
                    self._started(msg)
                elif kind == "error":
                    self._fail(str(msg.get("message", "")))
                elif kind == "warning":
                    log.warning("W&B: %s", msg.get("message", ""))
                elif kind == "finished":
                    self._finished.set()
        finally:
            if not self._finished.is_set() and not self._failed:
                self._fail(f"the W&B process exited early (log: {self.run_dir / 'wandb'})")
            self._finished.set()

    def _started(self, msg: dict[str, Any]) -> None:
        sync_dir = Path(str(msg.get("sync_dir", "")))
        if self._mode == "offline":
            pattern = sync_dir.parent / f"offline-run-*-{self.run_id}"
            log.warning(
                "W&B runs offline (%s): run %s is saved under %s. Upload it later with: "
                "wandb sync %s",
                self._why,
                self.run_id,
                sync_dir,
                pattern if self._start_step else sync_dir,
            )
        else:
            log.info("W&B run %s (%s): %s", self.run_id, self._mode, msg.get("url", ""))

    def _fail(self, message: str) -> None:
        if not self._failed:
            self._failed = True
            log.warning("tracker 'wandb' is disabled, the run goes on without it: %s", message)

    # -- the tracker interface ---------------------------------------------------------------
    def record(self, step: int, metrics: Mapping[str, float]) -> None:
        if self._failed:
            return
        self.last_step = step
        row: dict[str, float] = {}
        for key, value in metrics.items():
            with contextlib.suppress(TypeError, ValueError):
                row[key] = float(value)
        try:
            self._queue.put_nowait({"s": step, "m": row})
        except queue.Full:
            if not self._dropped:
                self._dropped = True
                log.warning("W&B falls behind: rows are dropped until it catches up")

    def close(self) -> None:
        """Log the learning curve and checkpoints, then finish: waits for the W&B process at
        most ``HARNESS_WANDB_FINISH_TIMEOUT`` seconds (default 120). Never raises."""
        if self._closed:
            return
        self._closed = True
        close = {
            "curve": str(self.run_dir / "learning_curve.png"),
            "checkpoints": str(self.run_dir / "checkpoints"),
            "step": self.last_step,
            "name": self.run_dir.name,
        }
        with contextlib.suppress(queue.Full):
            self._queue.put({"close": close}, timeout=5.0)
            self._queue.put(None, timeout=5.0)
        timeout = _env_float("HARNESS_WANDB_FINISH_TIMEOUT", 120.0)
        if not self._finished.wait(timeout):
            log.warning(
                "W&B did not finish within %g s; it goes on in the background (pid %d), and "
                "an offline run can be uploaded with `wandb sync`",
                timeout,
                self._proc.pid,
            )
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10.0)
        self._reader.join(timeout=5.0)


@hookimpl
def harness_register_trackers() -> list[TrackerSpec]:
    return [
        TrackerSpec(
            "wandb",
            make=WandbTracker,
            default=False,
            description="Weights & Biases (offline under RUN_DIR/wandb without a key/network)",
        )
    ]
