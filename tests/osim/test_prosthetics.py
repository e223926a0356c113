"""Prosthetics-v0 (NeurIPS 2018 AI for Prosthetics) on real OpenSim: the gymnasium contract, the
official rewards recomputed from recorded states, termination, the round-2 target generator,
simulator failures, and that resetting after episode ends does not leak memory."""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np
import pytest

pytest.importorskip("opensim", reason="opensim is not installed (pip install 'harness[osim]')")
pytest.importorskip("osim", reason="osim-rl is not installed (pip install 'harness[osim]')")

from gymnasium.utils import seeding
from gymnasium.utils.env_checker import check_env

from harness.errors import ConfigError
from harness_osim.prosthetics import (
    ProstheticsEnv,
    body_rotation,
    generate_targets,
    relative_observation,
)
from harness_osim.sim import OsimSim, SimulationError


def random_actions(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.0, 1.0, 19).astype(np.float32) for _ in range(n)]


@pytest.fixture(scope="module")
def env() -> Any:
    """One env shared by the cheap tests (model loading costs ~0.3 s); each test resets it and
    sets the options it needs."""
    e = ProstheticsEnv()
    yield e
    e.close()


# -- gymnasium contract ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("round_", "observation"), [(1, "official"), (2, "official"), (2, "relative")]
)
def test_check_env(round_: int, observation: str) -> None:
    e = ProstheticsEnv(round=round_, time_limit=5, observation=observation)
    check_env(e, skip_render_check=True)
    assert e.observation_space.shape == ((160,) if observation == "official" else (181,))
    assert e.action_space.shape == (19,)


def test_same_seed_same_episode_different_seed_different_targets() -> None:
    """Two separate envs, same seed and actions: identical observations and rewards (round 2,
    with frequent target changes so the seeded targets matter within 20 steps)."""
    actions = random_actions(20, seed=1)
    runs = []
    for _ in range(2):
        e = ProstheticsEnv(round=2, poisson_lambda=4.0)
        obs, _ = e.reset(seed=11)
        trace = [obs]
        rewards = []
        for a in actions:
            obs, r, term, trunc, _ = e.step(a)
            trace.append(obs)
            rewards.append(r)
            assert not (term or trunc)
        runs.append((np.stack(trace), np.array(rewards), e.targets))
        e.close()
    assert np.array_equal(runs[0][0], runs[1][0])
    assert np.array_equal(runs[0][1], runs[1][1])
    assert np.array_equal(runs[0][2], runs[1][2])

    # An episode does not depend on the previous one (OpenSim's integrator would start from the
    # previous episode's last excitation if reset did not fix it).
    e = ProstheticsEnv(round=2, poisson_lambda=4.0)
    e.reset(seed=11)
    e.step(np.ones(19))
    obs, _ = e.reset(seed=11)
    replay = [obs] + [e.step(a)[0] for a in actions[:5]]
    e.close()
    assert np.array_equal(np.stack(replay), runs[0][0][:6])

    # The env draws its targets from its own np_random, seeded by reset(seed=...).
    expected = generate_targets(seeding.np_random(11)[0], 1001, 4.0).velocity
    assert np.array_equal(runs[0][2], expected)
    a = generate_targets(np.random.default_rng(1), 1001).velocity
    b = generate_targets(np.random.default_rng(2), 1001).velocity
    assert not np.array_equal(a, b)


# -- rewards ---------------------------------------------------------------------------------------
def test_round1_reward_recomputed_from_recorded_states(env: ProstheticsEnv) -> None:
    env.configure(round=1, time_limit=None)
    env.reset(seed=0)
    assert env.time_limit == 300
    for a in random_actions(15, seed=2):
        before = env.state_desc()
        _, reward, _, _, info = env.step(a)
        desc = env.state_desc()
        assert env.prev_state_desc() is before
        vx = desc["body_vel"]["pelvis"][0]
        assert reward == pytest.approx(9.0 - (vx - 3.0) ** 2, abs=1e-9)
        assert info["official_reward"] == reward
        assert np.array_equal(info["target_velocity"], [3.0, 0.0, 0.0])
        assert desc["target_vel"] == [3.0, 0.0, 0.0]


def test_round2_reward_recomputed_and_target_index(env: ProstheticsEnv) -> None:
    """The step that ends at step index i is rewarded against targets[i]; with a small Poisson
    lambda the target changes within the first steps, so an off-by-one would show."""
    env.configure(round=2, time_limit=None, poisson_lambda=3.0)
    _, info = env.reset(seed=5)
    targets = env.targets
    assert env.time_limit == 1000 and targets.shape == (1001, 3)
    assert np.array_equal(info["target_velocity"], targets[0])
    changed_steps_seen = 0
    for i, a in enumerate(random_actions(20, seed=3), start=1):
        _, reward, _, _, info = env.step(a)
        desc = env.state_desc()
        act = env.sim.activations()
        assert np.array_equal(env.activations(), act)
        assert np.array_equal(info["target_velocity"], targets[i])
        assert np.array_equal(env.target_velocity(), targets[i])
        assert desc["target_vel"] == list(targets[i])
        v = desc["body_vel"]["pelvis"]
        t = targets[i]
        expected = 10.0 - (v[0] - t[0]) ** 2 - (v[2] - t[2]) ** 2 - 0.001 * float(np.sum(act**2))
        assert reward == pytest.approx(expected, abs=1e-9)
        assert info["official_reward"] == reward
        if not np.array_equal(targets[i], targets[i - 1]):
            changed_steps_seen += 1
            wrong = 10.0 - (v[0] - targets[i - 1][0]) ** 2 - (v[2] - targets[i - 1][2]) ** 2
            assert abs(reward - (wrong - 0.001 * float(np.sum(act**2)))) > 1e-9
    assert changed_steps_seen >= 2
    env.configure(round=1, poisson_lambda=300.0)


# -- episode ends ----------------------------------------------------------------------------------
def test_terminated_exactly_when_pelvis_below_0_6(env: ProstheticsEnv) -> None:
    """Zero excitation: the model collapses (about 90 steps); `terminated` must equal
    "pelvis height < 0.6" on every step, and the episode must end by falling."""
    env.configure(round=1, time_limit=None)
    env.reset(seed=0)
    zero = np.zeros(19, dtype=np.float32)
    heights = []
    for _ in range(300):
        _, _, terminated, truncated, _ = env.step(zero)
        height = env.state_desc()["body_pos"]["pelvis"][1]
        heights.append(height)
        assert terminated == (height < 0.6)
        assert not truncated
        if terminated:
            break
    assert terminated, f"no fall within 300 steps; lowest pelvis height {min(heights):.3f}"
    assert min(heights[:-1]) >= 0.6
    # The env resets and steps normally after a fall.
    env.reset()
    assert env.state_desc()["body_pos"]["pelvis"][1] == pytest.approx(0.94)
    assert env.step(zero)[2] is False


def test_truncated_at_time_limit(env: ProstheticsEnv) -> None:
    env.configure(round=1, time_limit=3)
    env.reset(seed=0)
    flags = [env.step(np.full(19, 0.1))[3] for _ in range(3)]
    assert flags == [False, False, True]
    env.configure(round=2)  # time_limit stays 3 (it was set explicitly), targets fit it
    env.reset(seed=0)
    assert env.time_limit == 3 and env.targets.shape == (4, 3)
    env.configure(round=1, time_limit=None)
    env.reset()
    assert env.time_limit == 300


# -- target generator ------------------------------------------------------------------------------
def test_target_generator_statistics() -> None:
    rng = np.random.default_rng(123)
    gaps = []
    n_changes = []
    deltas_speed = []
    for _ in range(300):
        tr = generate_targets(rng, 1001, 300.0)
        gaps.append(np.diff(np.concatenate([[0], tr.change_steps])))
        assert tr.speed[0] == 1.25 and tr.heading[0] == 0.0
        d_speed = np.diff(tr.speed)
        d_heading = np.diff(tr.heading)
        changed = np.flatnonzero((d_speed != 0) | (d_heading != 0)) + 1
        allowed = {int(s) for s in tr.change_steps if 1 <= s < 1001}
        assert set(changed.tolist()) == allowed  # changes exactly at the drawn steps
        assert np.all(np.abs(d_speed) <= 0.5)
        assert np.all(np.abs(d_heading) <= math.pi / 8)
        expected = np.stack(
            [tr.speed * np.cos(tr.heading), np.zeros(1001), tr.speed * np.sin(tr.heading)], 1
        )
        assert np.allclose(tr.velocity, expected, rtol=0, atol=1e-12)
        n_changes.append(len(allowed))
        deltas_speed.extend(d_speed[changed - 1].tolist())
    all_gaps = np.concatenate(gaps)
    assert abs(all_gaps.mean() - 300.0) < 2.0  # Poisson(300): std 17.3, 3000 draws
    assert 2.0 < np.mean(n_changes) < 4.0  # about 1000 / 300 changes per episode
    assert abs(np.mean(deltas_speed)) < 0.05  # symmetric sign
    assert np.max(np.abs(deltas_speed)) > 0.45  # and the full range is used


# -- observations ----------------------------------------------------------------------------------
def test_official_observation_layout(env: ProstheticsEnv) -> None:
    """Spot-check osim-rl's 160-value planar vector against the state dictionary."""
    env.configure(round=1, time_limit=None)
    env.reset(seed=0)
    for a in random_actions(5, seed=4):
        obs, *_ = env.step(a)
    d = env.state_desc()
    o = obs.astype(np.float64)
    p_pos, p_rot = d["body_pos"]["pelvis"], d["body_pos_rot"]["pelvis"]

    def close(got: Any, want: Any) -> bool:
        return bool(np.allclose(got, np.asarray(want, dtype=np.float32), rtol=1e-6, atol=1e-6))

    assert obs.shape == (160,)
    assert close(o[0:3], [p_pos[1], *d["body_vel"]["pelvis"][0:2]])
    assert close(o[5], p_rot[2])
    head = o[8:17]
    assert close(head[0:2], np.subtract(d["body_pos"]["head"][0:2], p_pos[0:2]))
    assert close(head[4:6], d["body_acc"]["head"][0:2])  # accelerations stay absolute
    assert close(head[6], d["body_pos_rot"]["head"][2] - p_rot[2])
    assert np.all(o[35:44] == 0) and np.all(o[53:62] == 0)  # toes_r, talus_r
    assert close(o[44], d["body_pos"]["talus_l"][0] - p_pos[0])
    assert close(o[62:65], [d[k]["ankle_l"][0] for k in ("joint_pos", "joint_vel", "joint_acc")])
    assert close(o[68], d["joint_pos"]["back"][0])
    assert close(o[71:74], d["joint_pos"]["hip_l"])
    assert close(o[92:95], [d[k]["knee_r"][0] for k in ("joint_pos", "joint_vel", "joint_acc")])
    first = sorted(d["muscles"])[0]
    m = d["muscles"][first]
    assert close(o[95:98], [m["activation"], m["fiber_length"], m["fiber_velocity"]])
    com = d["misc"]
    assert close(o[152:154], np.subtract(com["mass_center_pos"][0:2], p_pos[0:2]))
    assert close(o[154:160], [*com["mass_center_vel"], *com["mass_center_acc"]])


def test_relative_observation_is_invariant_to_heading_and_position() -> None:
    """The same motion started facing another way at another place gives the same relative
    observation (flat ground, vertical gravity), and body_rotation matches OpenSim."""
    e = ProstheticsEnv(observation="relative")
    layout = e.layout
    e.close()
    sims = [OsimSim("gait14dof22musc_pros_20180507.osim") for _ in range(2)]

    def turned(model: Any, state: Any) -> None:
        coords = model.getCoordinateSet()
        coords.get("pelvis_rotation").setValue(state, 0.8)
        coords.get("pelvis_tx").setValue(state, 1.5)
        coords.get("pelvis_tz").setValue(state, -2.0)

    sims[0].reset()
    sims[1].reset(turned)
    target = np.array([1.0, 0.0, 0.5])
    turned_target = np.array(
        [math.cos(0.8) * 1.0 + math.sin(0.8) * 0.5, 0.0, -math.sin(0.8) * 1.0 + math.cos(0.8) * 0.5]
    )
    for a in random_actions(4, seed=5):
        for s in sims:
            s.actuate(a)
            s.integrate()
    d0, d1 = sims[0].state_desc(), sims[1].state_desc()
    r0 = relative_observation(d0, target, layout)
    r1 = relative_observation(d1, turned_target, layout)
    assert r0.shape == (181,)
    # Equal up to the integrator's error control (accuracy 5e-5; seen: 7e-5), while a wrong
    # heading would misplace body offsets (~0.1-0.5 m) and velocities.
    assert np.allclose(r0, r1, rtol=1e-3, atol=1e-3)
    # ...while the ground-frame velocities really differ.
    assert not np.allclose(d0["body_vel"]["torso"], d1["body_vel"]["torso"], atol=1e-3)

    rot = sims[1].bodies.get("pelvis").getTransformInGround(sims[1].state).R()
    matrix = np.array([[rot.get(i, j) for j in range(3)] for i in range(3)])
    assert np.allclose(body_rotation(d1["body_pos_rot"]["pelvis"]), matrix, atol=1e-12)


# -- failures and bad input ------------------------------------------------------------------------
def test_simulator_failure_ends_episode_and_reset_recovers(
    env: ProstheticsEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.configure(round=2, time_limit=None)
    env.reset(seed=3)
    a = np.full(19, 0.2, dtype=np.float32)
    last_obs, *_ = env.step(a)

    def broken() -> None:
        raise SimulationError("integrator failed (test)")

    monkeypatch.setattr(env.sim, "integrate", broken)
    for _ in range(2):  # stepping on after the failure repeats the failure, without raising
        obs, reward, terminated, truncated, info = env.step(a)
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert info["sim_error"] == "integrator failed (test)"
        assert info["official_reward"] == 0.0 and info["target_velocity"].shape == (3,)
        assert np.all(np.isfinite(obs)) and np.array_equal(obs, last_obs)
    monkeypatch.undo()
    obs, _ = env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step(a)
    assert "sim_error" not in info and not truncated and reward > 0
    assert np.array_equal(obs, last_obs)  # same seed and action as before the failure
    env.configure(round=1)


def test_bad_options_and_actions(env: ProstheticsEnv) -> None:
    with pytest.raises(ConfigError, match=r"round=3.*allowed values: 1 .* or 2"):
        ProstheticsEnv(round=3)
    with pytest.raises(ConfigError, match="round"):
        env.configure(round="2")
    with pytest.raises(ConfigError, match=r"observation='pixels'.*official, relative"):
        ProstheticsEnv(observation="pixels")
    with pytest.raises(ConfigError, match="time_limit=0"):
        env.configure(time_limit=0)
    with pytest.raises(ConfigError, match=r"'rounds'.*round"):
        env.configure(rounds=2)
    with pytest.raises(ConfigError, match="observation"):
        env.configure(observation="relative")
    env.configure(round=1, time_limit=None)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(19,\).*\(18,\)"):
        env.step(np.zeros(18))
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((1, 19)))
    bad = np.zeros(19)
    bad[2] = np.nan
    with pytest.raises(ValueError, match=r"NaN.*hamstrings_r"):
        env.step(bad)
    assert env.step(np.full(19, 2.0))[0].shape == (160,)  # out of range: clipped, not an error
    assert np.all(env.sim.last_action == 1.0)


def test_configure_round_takes_effect_at_reset(env: ProstheticsEnv) -> None:
    env.configure(round=1, time_limit=None)
    env.reset(seed=0)
    env.configure(round=2)
    assert env.round == 1 and env.time_limit == 300  # not before the next reset
    obs, info = env.reset(seed=0)
    assert env.round == 2 and env.time_limit == 1000
    assert obs.shape == env.observation_space.shape
    assert np.array_equal(info["target_velocity"], [1.25, 0.0, 0.0])
    env.configure(round=1)


# -- memory ----------------------------------------------------------------------------------------
def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
def test_reset_after_episode_end_does_not_leak() -> None:
    """1000 episodes of one step each (time_limit=1, so each ends after one step and is reset;
    ~70 ms per episode, as the first step from rest is the slowest). Every reset builds a new
    OpenSim State and Manager; a leaked Manager costs ~0.3 MB (measured by keeping references),
    so 900 leaked episodes would add ~280 MB. The 20 MB slack absorbs allocator and Python
    heap noise while catching any per-episode leak above ~20 KB."""
    e = ProstheticsEnv(round=2, time_limit=1)
    a = np.full(19, 0.05, dtype=np.float32)
    start = time.perf_counter()
    rss = {}
    for episode in range(1, 1001):
        e.reset(seed=episode)
        _, _, terminated, truncated, _ = e.step(a)
        assert truncated or terminated
        if episode in (100, 1000):
            rss[episode] = _rss_mb()
    elapsed = time.perf_counter() - start
    e.close()
    assert rss[1000] - rss[100] < 20.0, f"RSS grew {rss[1000] - rss[100]:.1f} MB ({elapsed:.0f} s)"
