"""``harness plot``: grouping runs by config, the mean/spread across seeds, clear errors, and
the command over real tiny runs (the PNG is written, the aggregate checked against the CSVs)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.config import dump_toml, find_pack_file, layer, resolve
from harness.errors import HarnessError
from harness.plot_cli import aggregate_runs, load_curve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import train

PACK = find_pack_file(Path(__file__).resolve().parents[2] / "competitions" / "cartpole")


def _fake_run(
    root: Path, name: str, steps: list[int], values: list[float], seed: int = 0, lr: float = 1e-3
) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    config = {
        "run": {"algo": "ppo", "env": "CartPole-v1", "seed": seed, "name": name, "out": str(root)},
        "algo": {"learning_rate": lr},
    }
    (run_dir / "config.toml").write_text(dump_toml(config))
    with open(run_dir / "metrics.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["step", "charts/episodic_return", "eval/mean_return"])
        for step, value in zip(steps, values, strict=True):
            writer.writerow([step, value, ""])
        writer.writerow([steps[-1], "", 99.0])  # an eval row: no training return
    return run_dir


def test_seeds_of_one_config_are_averaged(tmp_path: Path) -> None:
    a = _fake_run(tmp_path, "a", [100, 200, 300], [1.0, 2.0, 3.0], seed=1)
    b = _fake_run(tmp_path, "b", [100, 200, 300], [3.0, 6.0, 9.0], seed=2)
    c = _fake_run(tmp_path, "c", [100, 200, 300], [5.0, 5.0, 5.0], seed=1, lr=3e-4)
    seeds, other = aggregate_runs([a, b, c])
    assert seeds.runs == [a, b] and other.runs == [c]
    np.testing.assert_array_equal(seeds.steps, [100, 200, 300])
    np.testing.assert_allclose(seeds.mean, [2.0, 4.0, 6.0])
    np.testing.assert_allclose(seeds.low, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(seeds.high, [3.0, 6.0, 9.0])
    np.testing.assert_allclose(seeds.std, [1.0, 2.0, 3.0])
    assert "learning_rate" in other.label  # the key that tells the two configs apart


def test_seeds_logged_at_different_steps_are_interpolated(tmp_path: Path) -> None:
    a = _fake_run(tmp_path, "a", [0, 100, 200, 300], [0.0, 1.0, 2.0, 3.0], seed=1)
    b = _fake_run(tmp_path, "b", [50, 250], [10.0, 30.0], seed=2)
    (agg,) = aggregate_runs([a, b])
    np.testing.assert_array_equal(agg.steps, [50, 100, 200, 250])  # the range both cover
    np.testing.assert_allclose(agg.mean, [(0.5 + 10) / 2, (1 + 15) / 2, (2 + 25) / 2, 16.25])


def test_eval_metric_uses_only_rows_that_have_it(tmp_path: Path) -> None:
    curve = load_curve(_fake_run(tmp_path, "a", [1, 2], [1.0, 2.0]), "eval/mean_return")
    assert curve.steps.tolist() == [2.0] and curve.values.tolist() == [99.0]


def test_clear_errors(tmp_path: Path) -> None:
    run = _fake_run(tmp_path, "a", [1, 2], [1.0, 2.0])
    with pytest.raises(HarnessError, match=r"no metrics\.csv"):
        aggregate_runs([tmp_path])
    with pytest.raises(HarnessError, match="not a directory"):
        aggregate_runs([tmp_path / "missing"])
    with pytest.raises(HarnessError, match="Available: charts/episodic_return, eval/mean_return"):
        aggregate_runs([run], "charts/episodic_retrun")


def test_harness_plot_over_tiny_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pm = make_plugin_manager()
    registry = collect_registry(pm)
    runs = []
    for seed in (1, 2, 3):
        overrides = [
            f"out='{tmp_path}'",
            f"name='s{seed}'",
            f"seed={seed}",
            "algo='random'",
            "total_steps=1536",
            "log_every=256",
            "eval_episodes=0",
            "checkpoint_every=0",
            "trackers=['csv']",
        ]
        config = resolve(layer(PACK, [], overrides, environ={}), registry)
        runs.append(train(config, registry, pm).run_dir)
    out, table = tmp_path / "curves.png", tmp_path / "curves.csv"
    args = [str(r) for r in runs]
    assert main(["plot", *args, "--out", str(out), "--csv", str(table), "--band", "std"]) == 0
    assert out.stat().st_size > 5000 and out.read_bytes()[:4] == b"\x89PNG"
    assert f"wrote {out}" in capsys.readouterr().out

    per_run = []
    for run in runs:
        with open(run / "metrics.csv", newline="") as fh:
            per_run.append(
                {float(r["step"]): float(r["charts/episodic_return"]) for r in csv.DictReader(fh)}
            )
    assert per_run[0] != per_run[1]  # the seeds differ
    with open(table, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["seeds"] for r in rows} == {"3"} and len(rows) == len(per_run[0])
    for row in rows:
        values = [p[float(row["step"])] for p in per_run]
        assert float(row["mean"]) == pytest.approx(np.mean(values))
        assert float(row["std"]) == pytest.approx(np.std(values))
        assert float(row["min"]) == min(values) and float(row["max"]) == max(values)
