"""The per-env adaptive goal range (``[env] adaptive``, plugins/harness_myo/adaptive.py) on the
real Die Reorient env: the rule, the goals it draws, its metric in a run, and that evaluations
run the task's full range."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from test_myo_packs import DIE, HAVE_MYOSUITE, ROOT, harness_cli, rows_of, train  # (this directory)

from harness.checkpoint import latest_checkpoint

RECIPE = ROOT / "competitions" / "myochallenge_2022_die" / "adaptive.toml"

pytestmark = pytest.mark.skipif(
    not HAVE_MYOSUITE,
    reason="MyoSuite is not installed: pip install 'harness[myo]' and pip install --no-deps "
    "myosuite==3.0.0",
)


def wrapped(adaptive: dict[str, object]):  # type: ignore[no-untyped-def]
    from harness_myo.plugin import MyoConfig, make_one

    return make_one(DIE, MyoConfig(adaptive=adaptive))


def goal_angles(env) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The Euler angles of the goal the env drew at its last reset."""
    from myosuite.physics.quat_math import quat2euler  # type: ignore[import-untyped]

    base = env.unwrapped
    return np.asarray(quat2euler(base.model.body_quat[base.goal_bid]))


def test_a_range_widens_on_its_windows_mean_and_stops_at_the_tasks_range() -> None:
    env = wrapped({"key": "goal_rot", "start": 0.5, "window": 3, "threshold": 0.6})
    level = env.level
    assert level.full_half_width == pytest.approx(1.57)  # P1's registered +-90 degrees
    level.episode_end({"solved_fraction": 1.0})
    level.episode_end({"solved_fraction": 1.0})
    assert level.half_width == 0.5  # the window is not full yet
    level.episode_end({"solved_fraction": 0.0})  # mean 2/3 >= 0.6
    assert level.half_width == pytest.approx(0.55)
    assert level.threshold == pytest.approx(0.6 * 0.99)
    for _ in range(2):  # the window was emptied: two episodes are not a window
        level.episode_end({"solved_fraction": 1.0})
    assert level.half_width == pytest.approx(0.55)
    for _ in range(3):
        level.episode_end({"solved_fraction": 0.1})  # a sliding window of poor episodes
    assert level.half_width == pytest.approx(0.55 * 1.1)  # (the first full window was good)
    for _ in range(20):
        level.episode_end({"solved_fraction": 0.1})
    assert level.half_width == pytest.approx(0.605)  # never narrows, never widens on 0.1
    for _ in range(200):
        level.episode_end({"solved_fraction": 1.0})
    assert level.half_width == pytest.approx(1.57)  # capped at the task's range
    assert level.threshold >= 0.3
    env.close()


def test_each_reset_draws_the_goal_within_the_envs_current_range() -> None:
    env = wrapped({"key": "goal_rot", "start": 0.2, "window": 1, "threshold": 1.0})
    for seed in range(5):
        env.reset(seed=seed)
        assert np.abs(goal_angles(env)).max() <= 0.2 + 1e-6
    env.level.half_width = 1.2  # (what widenings set)
    widest = 0.0
    for seed in range(5, 15):
        env.reset(seed=seed)
        widest = max(widest, float(np.abs(goal_angles(env)).max()))
    assert 0.2 < widest <= 1.2 + 1e-6
    env.close()


def test_episodes_report_the_range_they_ran_at_and_widen_it() -> None:
    """A real episode at rest ends with ``adaptive_range``, the half-width it ran at; with a
    one-episode window and a threshold of ~0, an episode solved on any step widens the range
    for the next, one never solved does not."""
    env = wrapped(
        {
            "key": "goal_rot",
            "start": 0.3,
            "window": 1,
            "metric": "solved_fraction",
            "threshold": 1e-9,
            "threshold_min": 0.0,
        }
    )
    env.reset(seed=0)
    seen: list[tuple[float, float]] = []
    rest = -np.ones(env.action_space.shape, dtype=np.float32)
    for _ in range(3):
        while True:
            _, _, terminated, truncated, info = env.step(rest)
            if terminated or truncated:
                m = info["episode_metrics"]
                seen.append((m["adaptive_range"], m["solved_fraction"]))
                env.reset()
                break
    for (ran_at, solved), (next_at, _) in itertools.pairwise(seen):
        assert next_at == pytest.approx(ran_at * 1.1 if solved > 0 else ran_at)
    assert seen[0][0] == pytest.approx(0.3)
    env.close()


def test_evaluations_build_their_envs_on_the_full_range() -> None:
    from harness.config import layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager
    from harness.runtime.build import make_envs

    pm = make_plugin_manager()
    registry = collect_registry(pm)
    pack = ROOT / "competitions" / "myochallenge_2022_die" / "pack.toml"
    config = resolve(layer(pack, [RECIPE], []), registry)
    training = make_envs(config, registry, 1, seed=0)
    evaluating = make_envs(config, registry, 1, seed=0, evaluation=True)
    assert training.envs[0].level.half_width == pytest.approx(0.1)
    assert evaluating.envs[0].level is None
    assert tuple(evaluating.envs[0].unwrapped.goal_rot) == pytest.approx((-1.57, 1.57))
    training.close()
    evaluating.close()


def test_a_run_logs_the_range_and_evaluates_without_it(tmp_path: Path) -> None:
    settings = [
        "run.total_steps=2048",
        "run.max_seconds=0",
        "run.actors=0",
        "run.num_envs=2",
        "run.eval_every=2048",
        "run.eval_episodes=2",
        "run.log_every=512",
        "run.progress=false",
        "algo.n_steps=256",
        "backend.threads=1",
    ]
    run_dir = train(
        "competitions/myochallenge_2022_die", tmp_path, settings, "--config", str(RECIPE)
    )
    rows = rows_of(run_dir)
    ranges = [float(r["charts/adaptive_range"]) for r in rows if r.get("charts/adaptive_range")]
    assert ranges and all(0.1 - 1e-9 <= x <= 1.57 for x in ranges)
    assert any(r.get("eval/score") for r in rows)
    assert not any(r.get("eval/adaptive_range") for r in rows)  # evaluated without it


def test_a_resume_point_starts_at_the_mean_range_with_the_threshold_its_widenings_left() -> None:
    from harness_myo.adaptive import resume_point

    rule = {"key": "goal_rot", "start": 0.1, "threshold": 0.85}
    point = resume_point(rule, 0.1 * 1.1**5)  # five widenings from the start
    assert point["start"] == pytest.approx(0.1 * 1.1**5)
    assert point["threshold"] == pytest.approx(0.85 * 0.99**5)
    assert point["key"] == "goal_rot" and point["window"] == 20  # the rest of the rule kept
    again = resume_point(point, 0.1 * 1.1**8)  # a resumed run's own point: 3 more widenings
    assert again["threshold"] == pytest.approx(0.85 * 0.99**8)
    assert resume_point(rule, 0.05) == {**point, "start": 0.1, "threshold": 0.85}
    low = resume_point({**rule, "threshold_decay": 0.5}, 0.1 * 1.1**5)
    assert low["threshold"] == 0.3  # not below threshold_min


def test_an_env_goes_on_from_a_resume_point_and_never_narrows() -> None:
    from harness_myo.adaptive import AdaptiveRange

    env = wrapped({"key": "goal_rot", "start": 0.1, "window": 3})
    env.configure(adaptive={"key": "goal_rot", "start": 0.4, "window": 3, "threshold": 0.7})
    env.reset(seed=0)  # (options change at a reset)
    assert env.level.half_width == pytest.approx(0.4)
    assert env.level.threshold == pytest.approx(0.7)
    assert np.all(np.abs(goal_angles(env)) <= 0.4 + 1e-6)
    env.level.resume(AdaptiveRange.parse({"key": "goal_rot", "start": 0.2}))
    assert env.level.half_width == pytest.approx(0.4)  # a narrower point leaves the range
    env.level.resume(AdaptiveRange.parse({"key": "goal_rot", "start": 9.0}))
    assert env.level.half_width == pytest.approx(1.57)  # capped at the task's range
    env.close()


def test_a_resumed_run_goes_on_from_its_logged_range(tmp_path: Path) -> None:
    """A run whose envs widened their range records where it stood in its checkpoints; the
    resumed run's envs start there, not from ``start`` again."""
    settings = [
        "run.total_steps=3072",
        "run.max_seconds=0",
        "run.actors=0",
        "run.num_envs=2",
        "run.eval_every=0",
        "run.checkpoint_every=3072",
        "run.log_every=512",
        "run.progress=false",
        "algo.n_steps=256",
        "backend.threads=1",
        # success at +-6 degrees is most episodes (the die starts within 15 degrees)
        'env.adaptive={key="goal_rot", start=0.1, window=1, metric="success", threshold=0.5}',
    ]
    run_dir = train("competitions/myochallenge_2022_die", tmp_path, settings)
    ckpt = latest_checkpoint(run_dir)
    point = json.loads((ckpt / "runner.json").read_text())["env_changes"]["adaptive"]
    logged = [
        float(r["charts/adaptive_range"])
        for r in rows_of(run_dir)
        if r.get("charts/adaptive_range")
    ]
    assert point["start"] == pytest.approx(logged[-1])  # the last logged mean
    assert point["start"] > 0.1 * 1.1 and point["threshold"] < 0.5  # widened at least twice

    proc = harness_cli(["run", "--resume", str(run_dir), "--steps", "6144"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in rows_of(run_dir) if float(r["step"]) > 3072 + 1024]
    resumed = [float(r["charts/adaptive_range"]) for r in rows if r.get("charts/adaptive_range")]
    # (each env's first resumed episode was drawn before the point applied: past 1024 steps,
    # the windows hold later episodes only)
    assert resumed and min(resumed) >= point["start"] - 1e-9


@pytest.mark.parametrize(
    ("env", "setting", "named"),
    [
        (DIE, 'env.adaptive={key="goal_rott", start=0.1}', "'goal_rot'"),
        (DIE, 'env.adaptive={key="goal_rot", strat=0.1}', "'start'"),
        (DIE, 'env.adaptive={key="goal_rot", start=0.1, metric="return"}', "solved_fraction"),
        (DIE, 'env.adaptive={key="goal_rot", start=0.1, growth=0.9}', "adaptive.growth"),
        ("myoChallengeOslRunFixed-v0", 'env.adaptive={key="goal_rot", start=0.1}', "ReorientEnv"),
    ],
)
def test_a_bad_adaptive_table_exits_2_naming_the_fix(
    tmp_path: Path, env: str, setting: str, named: str
) -> None:
    out = tmp_path / "runs"
    args = ["run", "competitions/myochallenge_2022_die", "--out", str(out), "--actors", "0"]
    args += [f"--set=run.env={env}", "--set=run.total_steps=256", f"--set={setting}"]
    proc = harness_cli(args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "adaptive" in proc.stderr
    assert named in proc.stderr, proc.stderr
    assert not out.exists() or not any(out.iterdir())  # no half-made run directory
