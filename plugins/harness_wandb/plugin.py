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
warning says how to ``wandb sync`` it. W&B never stops training: start-up and finish are
bounded in time, and any failure disables the tracker with one warning.
"""

from __future__ import annotations

import json
import logging
import netrc
import os
import re
import secrets
import socket
import string
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from harness import hookimpl
from harness.checkpoint import write_atomic_text
from harness.errors import PluginError
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


def _bounded(fn: Callable[[], Any], timeout: float, what: str) -> bool:
    """Run ``fn`` in a daemon thread; False (and the thread left behind) when it takes longer
    than ``timeout`` seconds. Exceptions propagate."""
    error: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name=f"harness-wandb-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return False
    if error:
        raise error[0]
    return True


class WandbTracker:
    """One W&B run per harness run directory (see the module docstring)."""

    def __init__(self, run_dir: Path, config: Any = None, start_step: int = 0) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise PluginError(
                f"the wandb tracker needs the wandb package ({exc}); pip install 'harness[wandb]'"
            ) from None
        self._wandb = wandb
        self.run_dir = Path(run_dir)
        self.last_step = start_step
        try:
            self.run = self._start(config, start_step)
        except Exception as exc:
            raise PluginError(f"W&B could not start ({type(exc).__name__}: {exc})") from exc

    def _start(self, config: Any, start_step: int) -> Any:
        wandb = self._wandb
        saved = self._saved()
        run_id = saved.get("id") or new_run_id()
        project = os.environ.get("WANDB_PROJECT") or saved.get("project") or DEFAULT_PROJECT
        group = os.environ.get("HARNESS_WANDB_GROUP") or saved.get("group") or None
        mode, why = choose_mode()
        # persisted before init: a crash during start-up still resumes the same run id
        record = {"id": run_id, "project": project, "group": group}
        write_atomic_text(self.run_dir / RUN_FILE, json.dumps(record, indent=2))
        cfg = _config_dict(config)
        run_cfg = cfg.get("run", {})
        wandb_dir = Path(os.environ.get("WANDB_DIR") or self.run_dir)
        wandb_dir.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(
            init_timeout=_env_float("HARNESS_WANDB_INIT_TIMEOUT", 60.0),
            silent=os.environ.get("WANDB_SILENT", "true").lower() != "false",
            console="off",  # harness logs its own output; no stdout wrapping in the hot loop
        )
        run = wandb.init(
            project=project,
            id=run_id,
            resume="allow",
            name=self.run_dir.name,
            group=group,
            tags=[str(run_cfg[k]) for k in ("algo", "env") if k in run_cfg] or None,
            config=cfg,
            dir=str(wandb_dir),
            mode=mode,  # type: ignore[arg-type]
            reinit="create_new",  # several runs in one process (tuning) never touch each other
            settings=settings,
        )
        run.define_metric(STEP_KEY)
        run.define_metric("*", step_metric=STEP_KEY)
        if mode == "offline":
            sync_dir = Path(run.settings.sync_dir)
            pattern = sync_dir.parent / f"offline-run-*-{run_id}"
            log.warning(
                "W&B runs offline (%s): run %s is saved under %s. Upload it later with: "
                "wandb sync %s",
                why,
                run_id,
                sync_dir,
                pattern if start_step else sync_dir,
            )
        else:
            log.info("W&B run %s (%s): %s", run_id, mode, getattr(run, "url", ""))
        return run

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

    def record(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.run is None:
            return
        self.last_step = step
        self.run.log({STEP_KEY: step, **metrics})

    def close(self) -> None:
        """Log the learning curve and checkpoints, then finish (bounded by
        ``HARNESS_WANDB_FINISH_TIMEOUT`` seconds, default 120). Never raises."""
        run, self.run = self.run, None
        if run is None:
            return
        try:
            self._log_outputs(run)
        except Exception as exc:
            log.warning("W&B: could not log the learning curve or checkpoints: %s", exc)
        timeout = _env_float("HARNESS_WANDB_FINISH_TIMEOUT", 120.0)
        try:
            if not _bounded(run.finish, timeout, "finish"):
                log.warning(
                    "W&B did not finish within %g s; the data is in %s, upload it with "
                    "`wandb sync`",
                    timeout,
                    run.settings.sync_dir,
                )
        except Exception as exc:
            log.warning("W&B: finishing run %s failed: %s", run.id, exc)

    def _log_outputs(self, run: Any) -> None:
        wandb = self._wandb
        curve = self.run_dir / "learning_curve.png"
        if curve.exists():
            run.log({"charts/learning_curve": wandb.Image(str(curve)), STEP_KEY: self.last_step})
        checkpoints = self.run_dir / "checkpoints"
        if checkpoints.is_dir() and any(checkpoints.glob("step_*")):
            name = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{self.run_dir.name}-checkpoints")
            artifact = wandb.Artifact(name, type="model", metadata={"step": self.last_step})
            # immutable: hashed in place, not copied to wandb's staging area
            artifact.add_dir(str(checkpoints), policy="immutable")
            run.log_artifact(artifact, aliases=["latest", f"step-{self.last_step}"])


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
