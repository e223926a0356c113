"""The envpool env family (plugins/harness_envpool) on real EnvPool envs: the env contract
(harness.testing.check_env) on an Atari and a MuJoCo task, the SAME_STEP autoreset against
EnvPool's own NEXT_STEP stream step by step, episodic life and the real game score, seeding,
frames beside harness_gymnasium's Atari preprocessing, the [env] checks, a missing EnvPool
refused at start-up, and IMPALA through ``harness run`` on envpool/Pong-v5 (serial and on a
one-actor farm)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("envpool", reason="EnvPool is not installed (pip install 'harness[envpool]')")

from harness.errors import ConfigError
from harness.plugins import collect_registry, make_plugin_manager
from harness.testing import check_env
from harness_envpool.plugin import EnvPoolConfig, import_envpool, make_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def registry() -> Any:
    return collect_registry(make_plugin_manager())


def test_envpool_ids_are_prefixed_and_accepts_imports_nothing(registry: Any) -> None:
    assert registry.env_for("envpool/Pong-v5").name == "envpool"
    assert registry.env_for("ALE/Pong-v5").name == "gymnasium"  # never shadowed
    spec = registry.env_for("envpool/Pong-v5")
    assert not spec.accepts("Pong-v5") and not spec.accepts("envpool/")
    code = (
        "import sys\nfrom harness_envpool.plugin import accepts\n"
        "assert accepts('envpool/Pong-v5')\nprint('envpool' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.stdout.strip() == "False", out.stderr[-2000:]


@pytest.mark.parametrize(
    ("env_id", "steps"), [("envpool/Pong-v5", 1200), ("envpool/HalfCheetah-v4", 1050)]
)
def test_check_env(registry: Any, env_id: str, steps: int) -> None:
    """A Pong game under random actions lasts ~900 agent steps; HalfCheetah is truncated
    at 1000."""
    check_env(registry.env_for(env_id), env_id, num_envs=2, steps=steps)


def test_same_step_autoreset_matches_envpools_own_stream() -> None:
    """Breakout (5 lives, episodic life) with one env: every step equals the step of a raw
    EnvPool pool with the same seed and actions, and where an episode ends the returned
    observation is the raw pool's *next* step's (the reset it does on its own, whatever the
    action), the final one is in infos["final_obs"]; the game goes on across lost lives, and
    the game_score reported when a game ends is the raw pool's unclipped reward summed over
    that game."""
    options = EnvPoolConfig()
    ours = make_env("envpool/Breakout-v5", num_envs=1, seed=7, options=options)
    envpool = import_envpool()
    raw = envpool.make_gymnasium("Breakout-v5", num_envs=1, seed=7, **ours._make_kwargs)
    rng = np.random.default_rng(0)
    try:
        obs, _ = ours.reset()
        raw_obs, _ = raw.reset()
        np.testing.assert_array_equal(obs, raw_obs)
        episodes, scores, raw_score, raw_scores = 0, [], 0.0, []
        for _ in range(1500):
            action = rng.integers(0, 4, 1)
            obs, reward, term, trunc, infos = ours.step(action)
            raw_obs, raw_reward, raw_term, raw_trunc, raw_info = raw.step(action)
            raw_score += float(raw_info["reward"][0])
            assert reward[0] == raw_reward[0] and term[0] == raw_term[0]
            assert trunc[0] == raw_trunc[0]
            if not (term[0] or trunc[0]):
                np.testing.assert_array_equal(obs, raw_obs)
                assert "final_obs" not in infos
                continue
            episodes += 1
            assert infos["_final_obs"].tolist() == [True]
            np.testing.assert_array_equal(infos["final_obs"][0], raw_obs[0])
            if raw_info["terminated"][0]:  # the game is over
                raw_scores.append(raw_score)
                raw_score = 0.0
                metrics = infos["final_info"]["episode_metrics"]
                scores.append(float(metrics["game_score"][0]))
            else:
                assert "final_info" not in infos  # a life lost: no game score yet
            first, *_ = raw.step(rng.integers(0, 4, 1))  # (ignored: it resets)
            np.testing.assert_array_equal(obs, first)
    finally:
        ours.close()
        raw.close()
    assert len(raw_scores) >= 2 and episodes >= 4 * len(raw_scores)  # 5 lives a game
    assert scores == raw_scores


def test_a_seeded_reset_restarts_the_same_trajectories() -> None:
    envs = make_env("envpool/Breakout-v5", num_envs=2, options=EnvPoolConfig())
    rng = np.random.default_rng(1)
    actions = [rng.integers(0, 4, 2) for _ in range(60)]

    def play(seed: int) -> list[np.ndarray]:
        out = [envs.reset(seed=seed)[0]]
        out += [envs.step(a)[0] for a in actions]
        return out

    try:
        first = play(3)
        again = play(3)  # after the first: a seeded reset starts afresh
        other = play(4)
    finally:
        envs.close()
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("game", ["Pong", "Breakout"])
def test_frames_look_like_harness_gymnasium_atari(game: str) -> None:
    """Same layout ((4, 84, 84) uint8, oldest frame first) and nearly the same picture as
    harness_gymnasium's DeepMind preprocessing of the same game (no sticky actions, no-op
    actions): measured 98-99.7% of the pixels equal over the first 60 steps (the rest are
    the ball and paddles, a few frames apart: the two pipelines play a different number of
    no-op and FIRE frames at a reset), the mean grey level within 0.2."""
    from harness_gymnasium.plugin import GymConfig
    from harness_gymnasium.plugin import make_env as make_gym_env

    ours = make_env(
        f"envpool/{game}-v5", num_envs=1, options=EnvPoolConfig(repeat_action_probability=0.0)
    )
    gym = make_gym_env(f"ALE/{game}-v5", num_envs=1, options=GymConfig(sticky_actions=0.0))
    try:
        assert ours.single_observation_space == gym.single_observation_space
        a, _ = ours.reset(seed=0)
        b, _ = gym.reset(seed=0)
        for _ in range(60):
            assert a.shape == b.shape == (1, 4, 84, 84) and a.dtype == b.dtype == np.uint8
            equal = float(np.mean(a[0, -1] == b[0, -1]))
            assert equal >= 0.95, equal
            assert abs(float(a.mean()) - float(b.mean())) < 1.0
            a, *_ = ours.step(np.zeros(1, np.int64))
            b, *_ = gym.step(np.zeros(1, np.int64))
    finally:
        ours.close()
        gym.close()


@pytest.mark.parametrize(
    ("env_id", "options", "says"),
    [
        ("envpool/Pongg-v5", EnvPoolConfig(), "Did you mean 'Pong-v5'"),
        ("envpool/HalfCheetah-v4", EnvPoolConfig(episodic_life=False), "[env] episodic_life"),
        ("envpool/Pong-v5", EnvPoolConfig(kwargs={"full_action_spac": True}), "full_action_space"),
        ("envpool/Pong-v5", EnvPoolConfig(kwargs={"seed": 3}), "kwargs sets 'seed'"),
        ("envpool/Pong-v5", EnvPoolConfig(kwargs={"reward_clip": False}), "[env] option"),
    ],
)
def test_bad_env_options_are_refused(env_id: str, options: EnvPoolConfig, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_env(env_id, num_envs=1, options=options)
    assert says in str(caught.value), str(caught.value)


def test_kwargs_reach_envpool() -> None:
    envs = make_env(
        "envpool/Pong-v5", num_envs=1, options=EnvPoolConfig(kwargs={"full_action_space": True})
    )
    assert envs.single_action_space.n == 18  # (Pong's minimal set has 6)
    envs.close()


def harness(tmp_path: Path, *args: str, block: str = "") -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process; ``block`` makes that module unimportable there (as
    on a machine without it)."""
    main = (
        "import sys\n"
        + (f"sys.modules[{block!r}] = None\n" if block else "")
        + "from harness.cli import main\nsys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run(
        [sys.executable, "-c", main, *args, "--out", str(tmp_path / "runs"), "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


PONG_IMPALA = """
[run]
algo = "impala"
env = "envpool/Pong-v5"
num_envs = 4
eval_every = 0
eval_episodes = 1
checkpoint_every = 0
trackers = ["csv"]
[algo]
cnn = "shallow"
rollout_len = 16
[backend]
threads = 1
[env]
num_threads = 1
"""


def test_a_missing_envpool_is_refused_with_the_extra_named(tmp_path: Path) -> None:
    pack = tmp_path / "pong.toml"
    pack.write_text(PONG_IMPALA)
    proc = harness(tmp_path, "run", str(pack), "--steps", "64", block="envpool")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("harness: error:")]
    assert len(errors) == 1 and "harness[envpool]" in errors[0], proc.stderr[-3000:]
    runs = tmp_path / "runs"
    assert not runs.exists() or not list(runs.iterdir())


@pytest.mark.parametrize("actors", [0, 1])
def test_impala_trains_on_envpool_pong_through_harness_run(tmp_path: Path, actors: int) -> None:
    """A few thousand steps of IMPALA (the shallow CNN) on envpool/Pong-v5, serially and on a
    farm of one actor process: the run completes and logs Pong episodes (a game of random
    play lasts 760-1000 agent steps: 4 envs x 1200) with their game scores."""
    pack = tmp_path / "pong.toml"
    pack.write_text(PONG_IMPALA)
    args = ["run", str(pack), "--steps", "4800", "--actors", str(actors)]
    proc = harness(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (metrics,) = (tmp_path / "runs").rglob("metrics.csv")  # (runs/envpool/Pong-v5__...)
    rows = metrics.read_text().splitlines()
    header = rows[0].split(",")
    last = dict(zip(header, rows[-1].split(","), strict=False))
    assert float(last["step"]) >= 4800
    scored = [
        float(dict(zip(header, row.split(","), strict=False)).get("charts/game_score") or "nan")
        for row in rows[1:]
    ]
    scores = [s for s in scored if s == s]
    assert scores and all(-21.0 <= s <= 21.0 for s in scores), scored
