"""Checkpoints and resume: atomic writes, and an agent restored from a checkpoint continues
exactly as the original would (same optimiser, replay and RNG state)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.api import EnvInfo, SpaceInfo, Transition
from harness.checkpoint import latest_checkpoint, save_checkpoint
from harness.plugins import collect_registry, make_plugin_manager
from harness.policy import State, as_policy

PACK = Path(__file__).resolve().parents[2] / "competitions" / "cartpole"


def test_failed_checkpoint_write_keeps_the_previous_one(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"

    def good(d: Path) -> None:
        (d / "payload").write_text("v1")

    first = save_checkpoint(root, 100, {"algo": "x"}, good)

    def dies_halfway(d: Path) -> None:
        (d / "payload").write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(root, 200, {"algo": "x"}, dies_halfway)
    assert latest_checkpoint(tmp_path) == first
    assert (first / "payload").read_text() == "v1"
    assert not list(root.glob("*.tmp-*"))
    (root / "step_0000000300.tmp-999").mkdir()  # a crashed writer's leftovers are ignored
    assert latest_checkpoint(tmp_path) == first


def test_keeps_the_newest_checkpoints(tmp_path: Path) -> None:
    for step in range(1, 6):
        save_checkpoint(tmp_path / "ck", step, {}, lambda d: None, keep=2)
    assert sorted(p.name for p in (tmp_path / "ck").glob("step_*")) == [
        "step_0000000004",
        "step_0000000005",
    ]


def _agent(algo: str, seed: int = 0):  # type: ignore[no-untyped-def]
    registry = collect_registry(make_plugin_manager())
    spec = registry.algorithms.get(algo.split("-")[0])
    backend = registry.backends.get("torch").load(
        registry.backends.get("torch").config_cls(threads=1)
    )
    backend.seed(seed)
    info = EnvInfo(
        "test", SpaceInfo("box", (4,), "float32"), SpaceInfo("discrete", (), "int64", n=2), 4
    )
    cfg = spec.config_cls()
    if algo == "dqn":
        cfg.learning_starts, cfg.batch_size, cfg.gradient_steps, cfg.train_freq = 16, 8, 3, 4
        cfg.prioritized = True
    else:
        cfg.n_steps, cfg.batch_size, cfg.n_epochs = 8, 8, 2
        if algo == "ppo-lstm":  # (the acting states are the caller's: passed on by the test)
            cfg.recurrent, cfg.rnn_hidden = "lstm", 8
    return spec.make_agent(info, backend, cfg, seed=seed, total_steps=10_000)


def _feed(agent, rng: np.random.Generator, steps: int, state: State) -> State:  # type: ignore[no-untyped-def]
    """``steps`` steps of made-up experience acted by ``agent``'s policy from ``state`` (the
    policy's per-env state, which whoever steps the envs keeps); the state after them."""
    policy = as_policy(agent)
    for _ in range(steps):
        obs = rng.standard_normal((4, 4)).astype(np.float32)
        actions, extras, state = policy.act(obs, state, explore=True)
        agent.observe(
            Transition(
                obs,
                actions,
                rng.standard_normal(4).astype(np.float32),
                rng.standard_normal((4, 4)).astype(np.float32),
                rng.random(4) < 0.1,
                np.zeros(4, dtype=bool),
                extras,
            )
        )
        agent.learn()
    return state


@pytest.mark.parametrize("algo", ["dqn", "ppo", "ppo-lstm"])
def test_restored_agent_continues_identically(algo: str, tmp_path: Path) -> None:
    a = _agent(algo)
    state = _feed(a, np.random.default_rng(1), 24, as_policy(a).initial_state(4))
    a.save(tmp_path / "ck")
    _feed(a, np.random.default_rng(2), 16, state)
    # the framework RNG is process-global: restore b only after a is done with it
    b = _agent(algo, seed=99)  # different init and RNG: everything must come from the checkpoint
    b.restore(tmp_path / "ck")
    _feed(b, np.random.default_rng(2), 16, state)
    wa, wb = a.weights(), b.weights()
    assert wa.keys() == wb.keys()
    for key in wa:
        np.testing.assert_array_equal(wa[key], wb[key], err_msg=key)
    obs = np.random.default_rng(3).standard_normal((8, 4)).astype(np.float32)
    np.testing.assert_array_equal(a.predict(obs), b.predict(obs))


def test_cli_resume_continues_the_run(tmp_path: Path) -> None:
    def harness(*args: str) -> None:
        cmd = [sys.executable, "-m", "harness.cli", "run", *args, "--no-progress"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr

    harness(
        str(PACK),
        "--steps",
        "4096",
        "--out",
        str(tmp_path),
        "--set",
        "name=r",
        "--set",
        "checkpoint_every=2048",
        "--set",
        "log_every=512",
        "--set",
        "eval_episodes=2",
        "--set",
        "stop_at_return=1000.0",
    )
    run_dir = tmp_path / "r"
    first = json.loads((run_dir / "summary.json").read_text())
    harness("--resume", str(run_dir), "--steps", "8192")
    second = json.loads((run_dir / "summary.json").read_text())
    assert first["steps"] >= 4096 and second["steps"] >= 8192
    assert second["episodes"] > first["episodes"]
    with open(run_dir / "metrics.csv") as fh:
        steps = [float(r["step"]) for r in csv.DictReader(fh) if r.get("perf/SPS")]
    assert steps == sorted(steps) and steps[-1] >= 8192 and steps[0] <= 1024
    assert (run_dir / "learning_curve.png").stat().st_size > 1000
    assert list((run_dir / "tensorboard").iterdir())


def _evals(run_dir: Path) -> list[tuple[float, float, str]]:
    with open(run_dir / "metrics.csv") as fh:
        return [
            (
                float(r["step"]),
                float(r["eval/mean_return"] or "nan"),
                r.get("eval/confirm_mean_return", ""),
            )
            for r in csv.DictReader(fh)
            if r.get("eval/mean_return") or r.get("eval/confirm_mean_return")
        ]


def test_keep_best_keeps_the_checkpoint_of_the_best_evaluation(tmp_path: Path) -> None:
    """``run.keep_best``: RUN_DIR/best holds one checkpoint, of the step whose periodic
    evaluation was the best so far, and ``harness eval RUN_DIR/best`` evaluates it."""
    from harness.checkpoint import read_meta

    overrides = ["name=b", "keep_best=true", "eval_every=2048", "eval_episodes=3"]
    cmd = [sys.executable, "-m", "harness.cli", "run", str(PACK), "--steps", "12288"]
    cmd += ["--out", str(tmp_path), "--no-progress", "--set", "trackers=['csv']"]
    for text in overrides:
        cmd += ["--set", text]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = tmp_path / "b"
    evals = [(step, mean) for step, mean, _ in _evals(run_dir) if mean == mean]
    best_step, _ = max(evals, key=lambda e: (e[1], -e[0]))  # the first of the best
    assert len({m for _, m in evals}) > 1, f"every evaluation scored the same: {evals}"
    (kept,) = (run_dir / "best" / "checkpoints").glob("step_*")
    assert latest_checkpoint(run_dir / "best") == kept
    assert int(kept.name.split("_")[1]) == best_step, (kept.name, evals)
    assert read_meta(kept)["algo"] == "ppo"
    again = subprocess.run(
        [sys.executable, "-m", "harness.cli", "eval", str(run_dir / "best"), "--episodes", "3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-2000:]


def test_stop_at_return_stops_only_when_a_confirming_evaluation_agrees(tmp_path: Path) -> None:
    """A first evaluation at or above ``run.stop_at_return`` is confirmed on other episodes
    (``eval/confirm_mean_return``) before the run stops."""
    cmd = [sys.executable, "-m", "harness.cli", "run", str(PACK), "--steps", "12288"]
    cmd += ["--out", str(tmp_path), "--no-progress", "--set", "trackers=['csv']"]
    cmd += ["--set", "eval_every=2048", "--set", "eval_episodes=3"]
    stop_at = subprocess.run(
        [*cmd, "--set", "name=low", "--set", "stop_at_return=1.0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert stop_at.returncode == 0, stop_at.stderr[-2000:]
    evals = _evals(tmp_path / "low")
    # every evaluation reaches 1.0: the first is confirmed and the run ends there
    assert [c for _, _, c in evals if c] and float(evals[-1][2]) >= 1.0, evals
    assert json.loads((tmp_path / "low" / "summary.json").read_text())["steps"] < 12288


@pytest.mark.parametrize("actors", [0, 2])
def test_sigterm_ends_a_run_with_a_checkpoint_it_resumes_from(tmp_path: Path, actors: int) -> None:
    """``harness run`` on SIGTERM (a scheduler's or ``timeout``'s notice) stops after the
    iteration it is in, writes a checkpoint and the summary without the final evaluation,
    exits 143 naming ``--resume``; the run resumes from that checkpoint. (Before, SIGTERM
    ended the process with only the periodic checkpoints, here none: checkpoint_every 0.)"""
    import os
    import signal
    import time

    cmd = [sys.executable, "-m", "harness.cli", "run", str(PACK), "--no-progress"]
    cmd += ["--out", str(tmp_path), "--actors", str(actors), "--steps", "50000000"]
    for s in ("name=t", "checkpoint_every=0", "eval_every=0", "log_every=512", "max_seconds=0"):
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / "t"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = run_dir / "metrics.csv"
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
                break  # training: two logged rows
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err[-3000:]
    assert "terminated (SIGTERM)" in err and f"--resume {run_dir}" in err, err[-2000:]
    assert "Traceback" not in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["terminated"] and summary["stopped_early"]
    assert summary["final_eval"] != summary["final_eval"]  # nan: no final evaluation
    ckpt = latest_checkpoint(run_dir)
    assert ckpt.name == f"step_{summary['steps']:010d}" and summary["steps"] > 0
    resume = [sys.executable, "-m", "harness.cli", "run", "--resume", str(run_dir)]
    again = subprocess.run(
        [*resume, "--no-progress", "--steps", str(summary["steps"] + 2048)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["steps"] >= summary["steps"] + 2048 and not resumed["terminated"]
