"""A finished run's ``learning_curve.png`` comes from the built-in plugin's ``harness_run_end``
hookimpl (``harness.builtin``), not from the train loop: drawn from the run's curves; with the
plugin blocked (``-p no:builtin``) no PNG is written and the run still succeeds; without
matplotlib a warning names the missing package."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from harness import hookimpl
from harness.config import find_pack_file, layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import RunResult, train

PACK = find_pack_file(Path(__file__).resolve().parents[2] / "competitions" / "cartpole")


class _Curves:
    """Keeps the run's curves as the run ends."""

    def __init__(self) -> None:
        self.history: list[tuple[int, float]] = []
        self.eval_history: list[tuple[int, float]] = []
        self.title = ""

    @hookimpl
    def harness_run_end(self, run: Any, summary: Mapping[str, Any]) -> None:
        self.history, self.eval_history = list(run.history), list(run.eval_history)
        self.title = f"{run.config.run.algo} on {run.config.run.env} (seed {run.config.run.seed})"


def _run(tmp_path: Path, blocked: tuple[str, ...] = ()) -> tuple[RunResult, _Curves]:
    pm = make_plugin_manager(blocked=blocked)
    curves = _Curves()
    pm.register(curves, name="curves")
    registry = collect_registry(pm)
    overrides = [
        f"out='{tmp_path}'",
        "trackers=[]",
        "progress=false",
        "total_steps=2048",
        "log_every=0",
        "eval_every=1024",
        "eval_episodes=2",
        "checkpoint_every=0",
    ]
    config = resolve(layer(PACK, [], overrides, environ={}), registry)
    return train(config, registry, pm), curves


def test_the_builtin_plugin_draws_the_runs_learning_curve(tmp_path: Path) -> None:
    from harness.plotting import plot_learning_curve

    result, curves = _run(tmp_path / "runs")
    png = result.run_dir / "learning_curve.png"
    assert png.stat().st_size > 1000
    assert curves.history and curves.eval_history  # (a curve with points on it)
    again = plot_learning_curve(
        curves.history, curves.eval_history, tmp_path / "again.png", curves.title
    )
    assert png.read_bytes() == again.read_bytes(), "not the run's curves"


def test_with_the_builtin_plugin_blocked_a_run_writes_no_png(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, blocked=("builtin",))
    assert (result.run_dir / "summary.json").is_file() and result.steps == 2048
    assert not (result.run_dir / "learning_curve.png").exists()


def test_without_matplotlib_a_warning_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "harness.plotting", None)  # (its import fails)
    with caplog.at_level(logging.WARNING, logger="harness.builtin"):
        result, _ = _run(tmp_path)
    assert (result.run_dir / "summary.json").is_file()
    assert not (result.run_dir / "learning_curve.png").exists()
    assert "matplotlib is missing: no learning_curve.png (pip install matplotlib)" in caplog.text
