"""The W&B tracker against real wandb offline runs, and tracker failure isolation.

The offline run is read back from its ``run-ID.wandb`` transaction log with
:mod:`harness_wandb.offline`: a checksum-verified reader of the LevelDB-style log that decodes
each record with wandb's own protobuf (``wandb.proto.wandb_internal_pb2.Record``), i.e. exactly
the data ``wandb sync`` would upload. Nothing here touches the network: ``WANDB_MODE=offline``
and every wandb directory points into ``tmp_path``.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from harness import hookimpl
from harness.config import find_pack_file, layer, resolve
from harness.errors import PluginError
from harness.plugins import collect_registry, make_plugin_manager
from harness.registry import TrackerSpec
from harness.runtime import train

wandb = pytest.importorskip("wandb")
from harness_wandb import offline  # noqa: E402
from harness_wandb.plugin import RUN_FILE, choose_mode  # noqa: E402

PACK = find_pack_file(Path(__file__).resolve().parents[2] / "competitions" / "cartpole")
SHORT = ["total_steps=2048", "log_every=512", "eval_every=0", "eval_episodes=2"]


@pytest.fixture
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Offline, silent, every wandb cache/config/staging dir inside tmp_path, no credentials."""
    home = tmp_path / "wandb-home"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(home / var.lower()))
    for var in ("WANDB_API_KEY", "WANDB_DIR", "WANDB_PROJECT", "HARNESS_WANDB_GROUP"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(home / "no-netrc"))
    return tmp_path


def _train(out: Path, *overrides: str, plugins: tuple[Any, ...] = (), resume: Path | None = None):  # type: ignore[no-untyped-def]
    pm = make_plugin_manager()
    for plugin in plugins:
        pm.register(plugin)
    registry = collect_registry(pm)
    base = [f"out='{out}'", "name='r'", *SHORT]
    config = resolve(layer(PACK, [], [*base, *overrides], environ={}), registry)
    return train(config, registry, pm, resume=resume)


def _csv_rows(run_dir: Path) -> list[dict[str, float]]:
    with open(run_dir / "metrics.csv", newline="") as fh:
        return [{k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(fh)]


def _offline_dirs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def test_offline_run_holds_the_same_metrics_as_the_csv(
    wandb_env: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HARNESS_WANDB_GROUP", "study-7")
    caplog.set_level(logging.WARNING)
    result = _train(
        wandb_env / "runs", "trackers=['csv', 'tensorboard', 'wandb']", "checkpoint_every=1024"
    )
    run_dir = result.run_dir
    (sync_dir,) = _offline_dirs(run_dir)
    run_id = json.loads((run_dir / RUN_FILE).read_text())["id"]
    assert sync_dir.name.endswith(f"-{run_id}")

    history = offline.read_history(sync_dir)
    scalars = [
        {k: float(v) for k, v in row.items() if not k.startswith("_") and k != "global_step"}
        for row in history
        if "charts/learning_curve/_type" not in row
    ]
    steps = [row["global_step"] for row in history if "charts/learning_curve/_type" not in row]
    csv_rows = _csv_rows(run_dir)
    assert len(csv_rows) >= 5  # 4 logging rows and the final evaluation
    assert steps == [row["step"] for row in csv_rows]
    assert scalars == [{k: v for k, v in r.items() if k != "step"} for r in csv_rows]
    namespaces = {k.split("/")[0] for row in scalars for k in row}
    assert {"charts", "losses", "perf", "eval"} <= namespaces

    info = offline.read_run_info(sync_dir)
    assert info["id"] == run_id and info["group"] == "study-7" and info["project"] == "harness"
    assert info["config"]["run"]["algo"] == "ppo" and info["config"]["algo"]["n_steps"] == 32
    curve = history[-1]
    assert curve["charts/learning_curve/_type"] == "image-file"
    assert curve["global_step"] == result.steps
    assert any(f.endswith(".png") and "learning_curve" in f for f in info["files"])
    assert (sync_dir / "files" / curve["charts/learning_curve/path"]).stat().st_size > 1000
    assert {"name": "r-checkpoints", "type": "model"} in info["artifacts"]
    hints = [r for r in caplog.records if "wandb sync" in r.getMessage()]
    assert len(hints) == 1 and str(sync_dir) in hints[0].getMessage()


def test_resume_continues_the_same_wandb_run(wandb_env: Path) -> None:
    out = wandb_env / "runs"
    first = _train(out, "trackers=['csv', 'wandb']", "checkpoint_every=1024")
    run_id = json.loads((first.run_dir / RUN_FILE).read_text())["id"]
    second = _train(out, "trackers=['csv', 'wandb']", "total_steps=4096", resume=first.run_dir)
    assert second.run_dir == first.run_dir and second.steps >= 4096
    dirs = _offline_dirs(first.run_dir)
    assert len(dirs) == 2  # `wandb sync` uploads both, in start order, into one run
    assert [offline.read_run_info(d)["id"] for d in dirs] == [run_id, run_id]
    resumed = [r["global_step"] for r in offline.read_history(dirs[1])]
    assert resumed[0] > first.steps - 1024 and resumed[-1] >= 4096


def test_wandb_failing_to_start_does_not_stop_the_run(
    wandb_env: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """wandb itself refuses to start (a mode it does not know): one warning, the run and the
    other trackers go on."""
    monkeypatch.setenv("WANDB_MODE", "no-such-mode")
    result = _train(wandb_env / "runs", "trackers=['csv', 'wandb']")
    assert result.steps >= 2048
    assert len(_csv_rows(result.run_dir)) >= 5
    (warning,) = [r for r in caplog.records if "'wandb' is disabled" in r.getMessage()]
    assert "W&B could not start" in warning.getMessage() and "mode" in warning.getMessage()


def test_the_trainer_never_imports_wandb(wandb_env: Path) -> None:
    """wandb runs in the tracker's own process: its import and start-up stay off the
    training process (the whole point of the worker), and the run is still recorded."""
    import subprocess
    import sys

    overrides = [f"out='{wandb_env / 'runs'}'", "name='r'", *SHORT, "trackers=['csv', 'wandb']"]
    code = f"""
import sys
from pathlib import Path
from harness.config import layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import train
pm = make_plugin_manager()
registry = collect_registry(pm)
config = resolve(layer(Path({str(PACK)!r}), [], {overrides!r}, environ={{}}), registry)
result = train(config, registry, pm)
assert "wandb" not in sys.modules, "the training process imported wandb"
print(result.run_dir)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    run_dir = Path(out.stdout.strip().splitlines()[-1])
    (sync_dir,) = _offline_dirs(run_dir)
    rows = offline.read_history(sync_dir)
    assert rows and rows[-1]["global_step"] >= 2048


def test_choose_mode_goes_offline_without_key_or_network(
    wandb_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_MODE")
    assert choose_mode()[0] == "offline"  # no API key, no netrc
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # discard port: refused at once
    mode, why = choose_mode()
    assert mode == "offline" and "unreachable" in why
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert choose_mode()[0] == "disabled"


class FlakyTracker:
    """Records one row, then raises on every call."""

    instances: ClassVar[list[FlakyTracker]] = []

    def __init__(self, run_dir: Path, config: Any = None, start_step: int = 0) -> None:
        self.calls = 0
        self.closed = False
        FlakyTracker.instances.append(self)

    def record(self, step: int, metrics: Mapping[str, float]) -> None:
        self.calls += 1
        if self.calls > 1:
            raise OSError("disk quota exceeded")

    def close(self) -> None:
        self.closed = True


class FlakyPlugin:
    @hookimpl
    def harness_register_trackers(self) -> list[TrackerSpec]:
        return [TrackerSpec("flaky", make=FlakyTracker, description="fails on its second row")]


def test_a_failing_tracker_is_reported_once_and_disabled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    FlakyTracker.instances.clear()
    caplog.set_level(logging.WARNING)
    result = _train(
        tmp_path, "trackers=['csv', 'flaky']", "algo='random'", plugins=(FlakyPlugin(),)
    )
    assert result.steps >= 2048
    (tracker,) = FlakyTracker.instances
    assert tracker.calls == 2 and tracker.closed  # never called again after it raised
    reports = [r for r in caplog.records if "flaky" in r.getMessage()]
    assert len(reports) == 1 and "disabled" in reports[0].getMessage()
    exc_info = reports[0].exc_info
    assert exc_info is not None and "disk quota exceeded" in str(exc_info[1])
    assert len(_csv_rows(result.run_dir)) >= 4  # the csv tracker kept every row


def _broken_make(run_dir: Path, config: Any, start_step: int = 0) -> Any:
    raise OSError("no space left on device")


class BrokenStartPlugin:
    @hookimpl
    def harness_register_trackers(self) -> list[TrackerSpec]:
        return [TrackerSpec("broken", make=_broken_make, description="cannot start")]


def test_a_named_tracker_that_cannot_start_refuses_the_run(tmp_path: Path) -> None:
    """Any exception from the factory of a tracker that run.trackers names (not only
    PluginError) refuses the run, naming the tracker (docs/plugins.md: one you name must
    start); no run directory is left. (Only a default tracker is skipped.)"""
    with pytest.raises(PluginError, match=r"Tracker 'broken' .*OSError: no space left on device"):
        _train(
            tmp_path, "trackers=['csv', 'broken']", "algo='random'", plugins=(BrokenStartPlugin(),)
        )
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]
