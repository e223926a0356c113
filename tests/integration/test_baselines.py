"""`harness baselines`: a baselines directory of the checkout's shape, run for real (A2C on
CartPole, two seeds, a small budget), recorded as JSON + PNG, listed and tabulated; bad names
and malformed files fail with a clear message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def harness(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=cwd,
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A directory laid out like a checkout: competitions/ (linked) and baselines/."""
    (tmp_path / "competitions").symlink_to(ROOT / "competitions")
    baselines = tmp_path / "baselines"
    baselines.mkdir()
    (baselines / "tiny_a2c.toml").write_text(
        'pack = "competitions/cartpole"\n'
        'configs = ["competitions/cartpole/a2c.toml"]\n'
        "threshold = 475\n"
        "seeds = [1, 2]\n"
        'set = ["total_steps=20_000", "eval_every=5_000", "eval_episodes=5"]\n'
    )
    return tmp_path


def test_run_records_every_seed_and_lists_and_tabulates(checkout: Path) -> None:
    out = checkout / "runs"
    proc = harness("baselines", "run", "tiny_a2c", "--out", str(out), cwd=checkout)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((checkout / "baselines" / "results" / "tiny_a2c.json").read_text())
    assert [r["seed"] for r in record["runs"]] == [1, 2]
    for row in record["runs"]:
        assert 0 < row["steps"] <= 20_000 + 5 * 8  # the budget, give or take one rollout
        assert row["eval_curve"], "no periodic evaluation recorded"
        assert row["eval_curve"][-1][0] <= row["steps"]
        assert 0.0 < row["fresh_eval_mean"] <= 500.0  # 20 fresh episodes of the final policy
        reached = [s for s, r in row["eval_curve"] if r >= 475]
        assert row["steps_to_threshold"] == (reached[0] if reached else None)
    png = checkout / "baselines" / "results" / "tiny_a2c.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    listed = harness("baselines", "list", cwd=checkout)
    assert listed.returncode == 0 and "tiny_a2c" in listed.stdout and "(recorded)" in listed.stdout
    table = harness("baselines", "table", cwd=checkout)
    assert table.returncode == 0
    rows = [line for line in table.stdout.splitlines() if line.startswith("| tiny_a2c |")]
    assert len(rows) == 2
    assert f"{record['runs'][0]['fresh_eval_mean']:.1f}" in rows[0]


def test_bad_names_and_files_fail_clearly(checkout: Path) -> None:
    proc = harness("baselines", "run", "tiny_a2d", cwd=checkout)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "No baseline 'tiny_a2d'" in proc.stderr and "tiny_a2c" in proc.stderr
    (checkout / "baselines" / "broken.toml").write_text("threshold = 1\n")
    proc = harness("baselines", "list", cwd=checkout)
    assert proc.returncode == 2 and "broken.toml has no 'pack' key" in proc.stderr
    proc = harness("baselines", "list", "--dir", str(checkout / "nowhere"), cwd=checkout)
    assert proc.returncode == 2 and "is not a directory" in proc.stderr
