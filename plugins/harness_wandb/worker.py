"""The W&B side of the ``wandb`` tracker, in a process of its own.

The training process never imports wandb: :class:`harness_wandb.plugin.WandbTracker` starts
``python -m harness_wandb.worker`` and sends it JSON lines on stdin:

* first ``{"init": {...wandb.init arguments...}, "start_step": N, "trainer_pid": PID}``
  (wandb's system monitor then samples the training process, not this one);
* then one ``{"s": step, "m": {metric: value}}`` per recorded row;
* last ``{"close": {"curve": PATH|null, "checkpoints": PATH|null, "step": N, "name": NAME}}``
  (or end of input, when the trainer died: the run is finished all the same).

It answers JSON lines on stdout: ``{"k": "started", "sync_dir": ..., "url": ...}`` or
``{"k": "error", "message": ...}``, and ``{"k": "finished"}`` at the end. wandb's import,
``init`` and the per-row ``log`` (about 2 ms each) thus cost the trainer nothing but a pipe
write, run on another core, and a wandb failure cannot take the training process with it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

STEP_KEY = "global_step"


def _say(kind: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"k": kind, **fields}) + "\n")
    sys.stdout.flush()


def _float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _outputs(wandb: Any, run: Any, close: dict[str, Any]) -> None:
    """The learning curve as media and the checkpoints as a model artifact."""
    step = close.get("step", 0)
    curve = close.get("curve")
    if curve and os.path.exists(curve):
        run.log({"charts/learning_curve": wandb.Image(curve), STEP_KEY: step})
    checkpoints = close.get("checkpoints")
    if not checkpoints or not os.path.isdir(checkpoints):
        return
    if any(name.startswith("step_") for name in os.listdir(checkpoints)):
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{close.get('name', 'run')}-checkpoints")
        artifact = wandb.Artifact(name, type="model", metadata={"step": step})
        # immutable: hashed in place, not copied to wandb's staging area
        artifact.add_dir(checkpoints, policy="immutable")
        run.log_artifact(artifact, aliases=["latest", f"step-{step}"])


def main() -> int:
    first = sys.stdin.readline()
    if not first:
        return 0
    try:
        request = json.loads(first)
        kwargs = request["init"]
        import wandb

        settings = wandb.Settings(
            init_timeout=_float("HARNESS_WANDB_INIT_TIMEOUT", 60.0),
            silent=os.environ.get("WANDB_SILENT", "true").lower() != "false",
            console="off",  # no stdout wrapping: stdout is the pipe to the trainer
            # system metrics of the training process (and its children), not of this one
            x_stats_pid=int(request.get("trainer_pid") or os.getppid()),
        )
        run = wandb.init(**kwargs, reinit="create_new", settings=settings)
        run.define_metric(STEP_KEY)
        run.define_metric("*", step_metric=STEP_KEY)
    except BaseException as exc:  # the trainer reports it and goes on without W&B
        _say("error", message=f"W&B could not start ({type(exc).__name__}: {exc})")
        return 1
    _say("started", sync_dir=str(run.settings.sync_dir), url=str(getattr(run, "url", "") or ""))
    close: dict[str, Any] = {}
    failed = False
    for line in sys.stdin:
        msg = json.loads(line)
        if "close" in msg:
            close = msg["close"]
            break
        if failed:
            continue
        try:
            run.log({STEP_KEY: msg["s"], **msg["m"]})
        except Exception as exc:  # reported once; the rows after it are dropped
            failed = True
            _say("error", message=f"W&B stopped logging ({type(exc).__name__}: {exc})")
    try:
        if close:
            _outputs(wandb, run, close)
    except Exception as exc:
        _say("warning", message=f"could not log the learning curve or checkpoints: {exc}")
    run.finish()
    _say("finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
