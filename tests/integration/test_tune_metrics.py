"""`harness tune` sees every ``eval/`` metric (a plugin env's episode metric ``eval/reached_end``
here), checks ``[tune] metric`` before the first trial against what the pack reports (a
one-iteration dry run; "did you mean"), and refuses learning-rate bounds that are not > 0.

The env is the third-party example's chain (tests/thirdparty_plugin), loaded straight from
its source directory as a module plugin (``-p harness_example.plugin``); every command is the
real CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("optuna")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "thirdparty_plugin"
PACK = ROOT / "competitions" / "cartpole" / "pack.toml"
TINY = [
    "run.env=ExampleChain-v0",
    "run.total_steps=1024",
    "run.eval_every=512",
    "run.eval_episodes=4",
    "run.checkpoint_every=0",
    "run.stop_at_return=1e9",
    "run.trackers=['csv']",
]


def tune(tmp_path: Path, body: str, *extra: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "tune.toml"
    config.write_text(body, encoding="utf-8")
    command = [sys.executable, "-m", "harness.cli", "tune", str(PACK), "--config", str(config)]
    command += ["-p", "harness_example.plugin", "--out", str(tmp_path / "studies"), *extra]
    for text in TINY:
        command += ["--set", text]
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_DISABLE_PLUGIN_AUTOLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLE), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600, check=False
    )


SPACE = """
[tune]
metric = "{metric}"
pruner = "none"

[tune.space]
"algo.learning_rate" = {{ type = "float", low = {low}, high = 3e-3 }}
"""


def test_an_env_plugins_eval_metric_is_the_objective(tmp_path: Path) -> None:
    proc = tune(tmp_path, SPACE.format(metric="eval/reached_end", low=1e-4), "--trials", "2")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    db = sqlite3.connect(tmp_path / "studies" / "cartpole" / "study.db")
    rows = db.execute(
        "SELECT t.state, v.value FROM trials t LEFT JOIN trial_values v USING (trial_id)"
    ).fetchall()
    assert [state for state, _ in rows] == ["COMPLETE", "COMPLETE"], proc.stdout
    assert all(0.0 <= value <= 1.0 for _, value in rows)  # a success rate over episodes
    reports = db.execute("SELECT COUNT(*) FROM trial_intermediate_values").fetchone()[0]
    assert reports >= 2  # the periodic evaluations reached the pruner too
    (run_dir,) = [p for p in (tmp_path / "studies").rglob("summary.json")][:1]
    assert "eval/reached_end" in json.loads(run_dir.read_text())["final_eval_metrics"]


def test_a_misspelled_metric_fails_before_the_first_trial(tmp_path: Path) -> None:
    proc = tune(tmp_path, SPACE.format(metric="eval/reached_edn", low=1e-4))
    assert proc.returncode == 2, proc.stderr
    error = proc.stderr[proc.stderr.index("harness: error:") :].strip()
    assert "'eval/reached_edn'" in error and "Did you mean 'eval/reached_end'" in error, error
    assert "Traceback" not in proc.stderr and "\n\n" not in error
    assert not (tmp_path / "studies").exists(), "a study was opened before the check"


@pytest.mark.parametrize("low", ["-1e-3", "0.0", "nan"])
def test_learning_rate_bounds_must_be_positive(tmp_path: Path, low: str) -> None:
    proc = tune(tmp_path, SPACE.format(metric="eval/mean_return", low=low))
    assert proc.returncode == 2, proc.stderr
    error = proc.stderr[proc.stderr.index("harness: error:") :].strip()
    assert "algo.learning_rate" in error and "low" in error, error
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "studies").exists()
