"""L2M2019-v0 (NeurIPS 2019 Learn to Move) on real OpenSim: the gymnasium contract, the target
velocity field (interpolation, rotation, sinks, targets), the official rewards recomputed from
recorded states, footsteps, termination and truncation, simulator failures, bad input, and that
resetting after falls does not leak memory."""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import numpy as np
import pytest

pytest.importorskip("opensim", reason="opensim is not installed (pip install 'harness[osim]')")
pytest.importorskip("osim", reason="osim-rl is not installed (pip install 'harness[osim]')")
pytest.importorskip("scipy", reason="scipy is not installed (pip install 'harness[osim]')")

from gymnasium.utils.env_checker import check_env

from harness.errors import ConfigError
from harness_osim.l2m import (
    ACTION_MUSCLES,
    INIT_POSE,
    FootstepAccumulator,
    L2M2019Env,
    RewardBook,
    round1_reward,
    round2_reward,
)
from harness_osim.sim import SimulationError
from harness_osim.vtgt import TargetField

BODYWEIGHT = 75.16460000000001 * 9.80665
DT = 0.01
CROUCH = [0.0, 0.0, 0.55, 0.0, 0.0, -math.pi / 2, -math.pi / 2, 0.0, 0.0, -math.pi / 2]
CROUCH += [-math.pi / 2, 0.0]
"""Pelvis at 0.55 m with hips and knees bent 90 degrees: below the fall height at reset without
the feet deep in the ground (a straight-legged pose that low makes OpenSim take seconds per
step), so the first step ends the episode cheaply."""


def random_actions(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.0, 1.0, 22).astype(np.float32) for _ in range(n)]


# -- gymnasium contract ----------------------------------------------------------------------------
@pytest.mark.parametrize(("difficulty", "observation"), [(1, "official"), (3, "relative")])
def test_check_env(difficulty: int, observation: str) -> None:
    env = L2M2019Env(difficulty=difficulty, time_limit=10, observation=observation)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*infinity.*")
        check_env(env, skip_render_check=True)
    assert env.observation_space.shape == ((339,) if observation == "official" else (421,))
    assert env.action_space.shape == (22,)
    env.close()


# -- the target-velocity field (no OpenSim) ------------------------------------------------------
def bilinear_by_hand(field: TargetField, x: float, y: float) -> np.ndarray:
    """The textbook bilinear interpolation on the map's grid, with off-map points moved to the
    nearest edge point (what interp2d's FITPACK evaluation did)."""
    xs, ys, v = field.map_x, field.map_y, field.values
    x = min(max(x, xs[0]), xs[-1])
    y = min(max(y, ys[0]), ys[-1])
    h = xs[1] - xs[0]
    i = min(int((x - xs[0]) // h), xs.size - 2)
    j = min(int((y - ys[0]) // h), ys.size - 2)
    fx, fy = (x - xs[i]) / h, (y - ys[j]) / h
    return np.asarray(
        (1 - fx) * (1 - fy) * v[i, j]
        + fx * (1 - fy) * v[i + 1, j]
        + (1 - fx) * fy * v[i, j + 1]
        + fx * fy * v[i + 1, j + 1]
    )


def test_field_interpolation_is_bilinear_and_clamps_off_the_map() -> None:
    field = TargetField(2)
    field.reset(np.random.default_rng(3))
    assert field.values.shape == (81, 81, 2)
    assert field.map_x[0] == -20.0 and field.map_x[-1] == 20.0 and field.map_x[1] == -19.5
    rng = np.random.default_rng(0)
    inside = rng.uniform(-19.9, 19.9, size=(200, 2))
    got = field.velocity_at(inside)
    want = np.array([bilinear_by_hand(field, x, y) for x, y in inside])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # on grid points: exactly the tabulated vector
    assert np.allclose(field.velocity_at(np.array([-20.0, 0.5])), field.values[0, 41], atol=1e-14)
    # off the map: the value at the nearest edge point, not a linear extrapolation
    outside = np.array([[25.0, 3.2], [-30.0, -40.0], [1.3, 21.0]])
    got = field.velocity_at(outside)
    want = np.array([bilinear_by_hand(field, x, y) for x, y in outside])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got[1], field.values[0, 0], rtol=0, atol=1e-14)


def test_local_field_rotates_with_the_agent() -> None:
    const = TargetField(0)
    const.reset(np.random.default_rng(0))
    ahead, _ = const.update(np.array([0.0, 0.0, 0.0]))
    assert ahead.shape == (2, 11, 11)
    np.testing.assert_allclose(ahead[0], 1.4, atol=1e-12)
    np.testing.assert_allclose(ahead[1], 0.0, atol=1e-12)
    # facing +y (left, yaw pi/2): the +x field comes from the agent's right, -y in its frame
    left, _ = const.update(np.array([3.0, -2.0, math.pi / 2]))
    np.testing.assert_allclose(left[0], 0.0, atol=1e-12)
    np.testing.assert_allclose(left[1], -1.4, atol=1e-12)

    # a sink field: entry [c, i, j] is the ground-frame vector at i - 5 m ahead and j - 5 m to the
    # left of the agent, rotated into its frame
    field = TargetField(3)
    field.reset(np.random.default_rng(1))
    pose = np.array([1.5, -0.7, 0.6])
    local = field.local_field(pose)
    c, s = math.cos(pose[2]), math.sin(pose[2])
    for i, j in [(0, 0), (5, 5), (10, 2), (3, 9)]:
        fwd, lft = i - 5, j - 5
        point = pose[:2] + np.array([c * fwd - s * lft, s * fwd + c * lft])
        vx, vy = bilinear_by_hand(field, *point)
        np.testing.assert_allclose(local[:, i, j], [c * vx + s * vy, -s * vx + c * vy], atol=1e-12)


def sink_rule(d: float, d_sink: float, lo: float, hi: float, phase0: float) -> float:
    """osim-rl's _set_sink_vtgt_amp, written as its scalar if/elif chain."""
    if d > d_sink + 1:
        return hi
    if d > 1:
        return 0.5 * (hi - lo) * math.sin(phase0 + d / d_sink * 2 * math.pi) + 0.5 * (lo + hi)
    at_1 = 0.5 * (hi - lo) * math.sin(phase0 + 1 / d_sink * 2 * math.pi) + 0.5 * (lo + hi)
    return d * at_1


@pytest.mark.parametrize("version", [1, 2, 3])
def test_sink_field_points_at_the_sink_with_the_rule_s_speed(version: int) -> None:
    field = TargetField(version)
    field.reset(np.random.default_rng(10 + version))
    assert field.sink is not None
    assert 5.0 <= np.linalg.norm(field.sink) <= 7.0
    if version == 1:
        assert field.sink[1] == 0.0  # straight ahead
    if version == 2:
        assert field.sink[0] > 0.0  # within +-90 degrees
    assert math.isclose(field.d_sink, float(np.linalg.norm(field.sink)))
    assert 2.0 <= field.t0_target <= 4.0
    rng = np.random.default_rng(version)
    for i, j in rng.integers(0, 81, size=(300, 2)):
        p = np.array([field.map_x[i], field.map_y[j]])
        to_sink = field.sink - p
        d = float(np.linalg.norm(to_sink))
        v = field.values[i, j]
        want = sink_rule(d, field.d_sink, 0.8, 1.8, field.v_phase0)
        assert math.isclose(float(np.linalg.norm(v)), want, rel_tol=1e-12, abs_tol=1e-12)
        np.testing.assert_allclose(v, want * to_sink / d, atol=1e-12)
    # near the sink (within 1 m) the speed falls linearly to zero
    near = field.velocity_at(field.sink + np.array([0.05, 0.0]))
    assert np.linalg.norm(near) < 0.1


def test_field_determinism_comes_from_the_generator() -> None:
    a, b, c = TargetField(3), TargetField(3), TargetField(3)
    a.reset(np.random.default_rng(42))
    np.random.seed(0)  # global NumPy state must not matter
    b.reset(np.random.default_rng(42))
    c.reset(np.random.default_rng(43))
    assert np.array_equal(a.values, b.values) and np.array_equal(a.sink, b.sink)  # type: ignore[arg-type]
    assert a.t0_target == b.t0_target
    assert not np.array_equal(a.values, c.values)


def test_targets_are_reached_after_staying_longer_than_t0() -> None:
    field = TargetField(3)
    field.reset(np.random.default_rng(5))
    assert field.sink is not None
    first = field.sink.copy()
    # stay within r_target: the target is reached at the first update where the time spent
    # there (accumulated in steps of dt) exceeds t0_target
    t, expected = 0.0, 0
    while t <= field.t0_target:
        t += DT
        expected += 1
    pose = np.array([first[0] + 0.2, first[1] - 0.1, 0.3])  # 0.22 m from the sink
    flags = [field.update(pose)[1] for _ in range(expected)]
    assert flags == [False] * (expected - 1) + [True]
    assert field.i_target == 2 and field.t_target == 0.0
    second = field.sink.copy()
    assert 5.0 <= np.linalg.norm(second - first) <= 7.0
    # the map is re-centred on the agent, the new field points at the new sink
    assert math.isclose(field.map_x[40], pose[0]) and math.isclose(field.map_y[40], pose[1])
    v = field.velocity_at(pose[:2])
    assert float(np.dot(v, second - pose[:2])) > 0.99 * np.linalg.norm(v) * np.linalg.norm(
        second - pose[:2]
    )

    # leaving the target restarts the clock
    near2 = np.array([second[0], second[1], 0.0])
    far = np.array([second[0] + 1.0, second[1], 0.0])
    for _ in range(10):
        field.update(near2)
    assert field.t_target > 0
    field.update(far)
    assert field.t_target == 0.0
    # version 3 has two targets: the second is reached (flag) but no third sink is made
    t, n = 0.0, 0
    while t <= field.t0_target:
        t += DT
        n += 1
    flags = [field.update(near2)[1] for _ in range(n)]
    assert flags[-1] and not any(flags[:-1])
    assert np.array_equal(field.sink, second) and field.i_target == 3
    assert not any(field.update(near2)[1] for _ in range(n + 50))

    # versions 1 and 2 make new targets forever
    endless = TargetField(1)
    endless.reset(np.random.default_rng(0))
    reached = 0
    for _ in range(4):
        assert endless.sink is not None
        at = np.array([endless.sink[0], endless.sink[1], 0.0])
        reached += sum(endless.update(at)[1] for _ in range(401))
    assert reached == 4 and endless.i_target == 5


# -- reward rules on synthetic inputs --------------------------------------------------------------
def test_reward_functions_by_hand() -> None:
    zero = np.zeros(2)
    v_body, v_tgt = np.array([1.0, 0.2]), np.array([1.4, 0.0])
    # round 1: 10 accumulating steps, a footstep rewarded at the 10th
    book = RewardBook()
    for k in range(10):
        book.new_footstep = k == 9
        r = round1_reward(
            book, dt=DT, act2=0.5, v_body=v_body, v_tgt=v_tgt, fell=False, at_limit=False
        )
    del_v = np.linalg.norm((v_body - v_tgt) * 0.1)
    assert math.isclose(r, 0.1 + 10 * 0.1 - del_v - 0.5 * 0.1, abs_tol=1e-12)
    assert book.footstep.del_t == 0.0 and book.footstep.effort == 0.0
    assert math.isclose(book.effort_total, 0.05, abs_tol=1e-15)
    # round 1 success bonus without a footstep this step: the unfinished footstep's 10 del_t + 10
    book = RewardBook()
    for _ in range(3):
        r = round1_reward(
            book, dt=DT, act2=0.0, v_body=zero, v_tgt=zero, fell=False, at_limit=False
        )
    r = round1_reward(book, dt=DT, act2=0.0, v_body=zero, v_tgt=zero, fell=False, at_limit=True)
    assert math.isclose(r, 0.1 + 10 * 0.04 + 10, abs_tol=1e-12)
    # ... with a footstep this step: osim-rl re-adds that footstep's 10 del_t
    book = RewardBook(footstep=FootstepAccumulator(del_t=0.19), new_footstep=True)
    r = round1_reward(book, dt=DT, act2=0.0, v_body=zero, v_tgt=zero, fell=False, at_limit=True)
    assert math.isclose(r, 0.1 + 2.0 + 2.0 + 10, abs_tol=1e-12)
    # ... and no bonus after a fall
    book = RewardBook()
    r = round1_reward(book, dt=DT, act2=0.0, v_body=zero, v_tgt=zero, fell=True, at_limit=True)
    assert math.isclose(r, 0.1, abs_tol=1e-15)

    # round 2: the velocity weight is 3; success (> 5 footsteps) closes the unfinished footstep
    book = RewardBook(n_footsteps=6, footstep=FootstepAccumulator(del_t=0.5))
    r = round2_reward(book, dt=DT, act2=0.0, v_body=v_body, v_tgt=v_tgt, fell=False, at_limit=True)
    assert math.isclose(
        r, 0.1 + 10 * 0.51 - 3 * np.linalg.norm((v_body - v_tgt) * DT), abs_tol=1e-12
    )
    book = RewardBook(n_footsteps=5, footstep=FootstepAccumulator(del_t=0.5))
    r = round2_reward(book, dt=DT, act2=0.0, v_body=zero, v_tgt=zero, fell=False, at_limit=True)
    assert math.isclose(r, 0.1, abs_tol=1e-15) and math.isclose(book.footstep.del_t, 0.51)
    book = RewardBook(target_reached=True)
    r = round2_reward(book, dt=DT, act2=0.0, v_body=zero, v_tgt=zero, fell=False, at_limit=False)
    assert math.isclose(r, 500.1, abs_tol=1e-12)


# -- the env on OpenSim: rewards, footsteps, termination recomputed from recorded states -----------
def record(
    env: L2M2019Env, actions: list[np.ndarray], seed: int, hook: Any = None
) -> dict[str, Any]:
    obs, info = env.reset(seed=seed)
    if hook is not None:
        hook(env)
    rows: list[dict[str, Any]] = []
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        d = env.state_desc()
        rows.append(
            {
                "reward": r,
                "terminated": term,
                "truncated": trunc,
                "info": info,
                "act2": sum(m["activation"] ** 2 for m in d["muscles"].values()),
                "pelvis": np.array(d["body_pos"]["pelvis"]),
                "pelvis_vel": np.array(d["body_vel"]["pelvis"]),
                "foot_fy": (d["forces"]["foot_r"][1], d["forces"]["foot_l"][1]),
                "istep": env.sim.istep,
                "obs": obs,
                "field": d["v_tgt_field"],
            }
        )
        if term or trunc:
            break
    return {"rows": rows, "time_limit": env.time_limit}


def recompute_rewards(
    rows: list[dict[str, Any]], round_: int, time_limit: int, hook: Any = None
) -> list[float]:
    """The official rewards by the rules, from the recorded states alone. ``hook(k, row)``
    returns whether a target was reached at step k's field update (round 2)."""
    w_v = 1.0 if round_ == 1 else 3.0
    contact = [True, True]
    new_step, n_steps, reached_before = False, 0, False
    del_t, del_v, effort = 0.0, np.zeros(2), 0.0
    out = []
    for k, row in enumerate(rows):
        reward = 0.1
        effort += row["act2"] * DT
        del_t += DT
        tv = row["info"]["target_velocity"]
        v_body = np.array([row["pelvis_vel"][0], -row["pelvis_vel"][2]])
        del_v = del_v + (v_body - np.array([tv[0], -tv[2]])) * DT
        fell = row["pelvis"][1] < 0.6
        at_limit = row["istep"] >= time_limit
        closed = None
        success = not fell and at_limit and (round_ == 1 or n_steps > 5)
        if new_step or (round_ == 2 and success):
            closed = 10 * del_t
            reward += closed - w_v * float(np.linalg.norm(del_v)) - effort
            del_t, del_v, effort = 0.0, np.zeros(2), 0.0
        if round_ == 1 and success:
            reward += (10 * del_t if closed is None else closed) + 10
        if round_ == 2 and reached_before:
            reward += 500
        out.append(reward)
        # after the reward: this step's footstep and target, rewarded at the next step
        now = [row["foot_fy"][0] < -0.05 * BODYWEIGHT, row["foot_fy"][1] < -0.05 * BODYWEIGHT]
        new_step = (now[0] and not contact[0]) or (now[1] and not contact[1])
        n_steps += new_step
        contact = now
        assert row["info"]["footsteps"] == n_steps
        reached_before = bool(hook(k, row)) if hook is not None else False
    return out


def test_round1_rewards_footsteps_and_truncation_from_recorded_states() -> None:
    env = L2M2019Env(difficulty=2, time_limit=100)
    run = record(env, random_actions(100, seed=0), seed=7)
    rows = run["rows"]
    assert len(rows) == 100, "the episode should reach its time limit without a fall"
    assert [r["truncated"] for r in rows] == [False] * 99 + [True]
    assert not any(r["terminated"] for r in rows)
    assert all(r["pelvis"][1] >= 0.6 for r in rows)
    assert rows[-1]["info"]["footsteps"] >= 1, "the run should contain a footstep to check"
    want = recompute_rewards(rows, 1, 100)
    got = [r["reward"] for r in rows]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    assert got[-1] > 10  # the success bonus
    assert all(r["info"]["official_reward"] == r["reward"] for r in rows)
    # the target velocity is the field at the pelvis, mapped to the ground frame as (vx, 0, -vy)
    for r in rows[::10]:
        vx, vy = env.field.velocity_at(np.array([r["pelvis"][0], -r["pelvis"][2]]))
        np.testing.assert_allclose(r["info"]["target_velocity"], [vx, 0.0, -vy], atol=1e-12)
    env.close()


def test_round2_rewards_and_target_bonus_from_recorded_states() -> None:
    """Difficulty 3, with the first target moved onto the pelvis and a short dwell time so that
    it is reached within the run: its 500 comes one step after the field update that reached it."""
    env = L2M2019Env(difficulty=3, time_limit=100)
    sink_t0 = {}

    def move_target(e: L2M2019Env) -> None:
        p = e.state_desc()["body_pos"]["pelvis"]
        e.field.sink = np.array([p[0], -p[2]])
        e.field.t0_target = 0.155
        sink_t0["sink"] = e.field.sink.copy()

    run = record(env, random_actions(100, seed=0), seed=3, hook=move_target)
    rows = run["rows"]
    state = {"t": 0.0, "done": False}

    def reached(k: int, row: dict[str, Any]) -> bool:
        if state["done"]:
            return False
        xy = np.array([row["pelvis"][0], -row["pelvis"][2]])
        state["t"] = state["t"] + DT if np.linalg.norm(xy - sink_t0["sink"]) < 0.3 else 0.0
        if state["t"] > 0.155:
            state["done"] = True
            return True
        return False

    want = recompute_rewards(rows, 2, 100, hook=reached)
    got = [r["reward"] for r in rows]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    k = next(i for i, r in enumerate(rows) if r["info"]["target_reached"])
    assert k == 15  # the 16th step's update: 16 x 0.01 s > 0.155 s
    assert got[k + 1] > 400 and got[k] < 400
    assert env.field.sink is not None
    assert not np.array_equal(env.field.sink, sink_t0["sink"])  # a second target was made
    assert rows[-1]["info"]["footsteps"] >= 1, "the run should contain a footstep to check"
    assert len(rows) == 100 and rows[-1]["truncated"]
    env.close()


def test_fall_terminates() -> None:
    env = L2M2019Env(difficulty=1, init_pose=CROUCH)
    obs, _ = env.reset(seed=0)
    assert obs[242] < 0.6  # pelvis height at reset
    obs, r, term, trunc, _ = env.step(np.zeros(22))
    assert term and not trunc
    assert env.state_desc()["body_pos"]["pelvis"][1] < 0.6
    assert r == 0.1  # alive only: no footstep can be rewarded at the first step, no bonus
    env.close()


# -- observation, action order, options ------------------------------------------------------------
def test_official_observation_layout_and_action_order() -> None:
    env = L2M2019Env(difficulty=0)
    obs, info = env.reset(seed=0)
    np.testing.assert_allclose(info["target_velocity"], [1.4, 0.0, 0.0], atol=1e-12)
    assert obs.shape == (339,) and obs.dtype == np.float32
    np.testing.assert_allclose(obs[:121], 1.4, atol=1e-6)  # constant forward field, yaw 0
    np.testing.assert_allclose(obs[121:242], 0.0, atol=1e-6)
    assert obs[242] == np.float32(0.94)
    # exciting action[2] (HFL_r) drives the model's iliopsoas_r, not its hamstrings_r
    a = np.zeros(22, dtype=np.float32)
    a[ACTION_MUSCLES.index("iliopsoas_r")] = 1.0
    assert ACTION_MUSCLES.index("iliopsoas_r") == 2
    for _ in range(5):
        obs, *_ = env.step(a)
    act = env.activations()
    assert int(np.argmax(act)) == 2
    muscles = env.state_desc()["muscles"]
    assert (
        muscles["iliopsoas_r"]["activation"] == act[2] > 5 * muscles["hamstrings_r"]["activation"]
    )
    # observation = field (body frame, flattened [c, i, j]) + body values
    d = env.state_desc()
    np.testing.assert_array_equal(obs[:242], d["v_tgt_field"].reshape(-1).astype(np.float32))
    assert obs[242] == np.float32(d["body_pos"]["pelvis"][1])
    assert obs[242 + 9 + 4] == np.float32(-d["joint_pos"]["hip_r"][0])  # hip extension, right
    env.close()


def test_configure_takes_effect_at_reset_and_init_pose() -> None:
    env = L2M2019Env(difficulty=3, init_pose=[1.0, *INIT_POSE[1:]])
    env.reset(seed=0)
    assert env.time_limit == 2500
    assert math.isclose(env.state_desc()["body_vel"]["pelvis"][0], 1.0, abs_tol=1e-9)
    env.configure(difficulty=0, init_pose=None)
    assert env.time_limit == 2500 and env.difficulty == 3
    obs, _ = env.reset(seed=0)
    assert env.time_limit == 1000 and env.field.version == 0
    np.testing.assert_allclose(obs[:121], 1.4, atol=1e-6)
    assert abs(env.state_desc()["body_vel"]["pelvis"][0]) < 1e-9
    env.configure(time_limit=3)
    env.reset(seed=0)
    for k in range(3):
        *_, trunc, _ = env.step(np.zeros(22))
        assert trunc == (k == 2)
    env.close()


def test_bad_input() -> None:
    with pytest.raises(ConfigError, match=r"difficulty.*0.*1.*2.*3"):
        L2M2019Env(difficulty=5)
    with pytest.raises(ConfigError, match="observation"):
        L2M2019Env(observation="pixels")
    with pytest.raises(ConfigError, match="init_pose"):
        L2M2019Env(init_pose=[0.0, 1.0])
    env = L2M2019Env(difficulty=1)
    with pytest.raises(ConfigError, match="difficulty"):
        env.configure(difficulty=-1)
    with pytest.raises(ConfigError, match="time_limit"):
        env.configure(time_limit=0)
    with pytest.raises(ConfigError, match="difficulty"):
        env.configure(dificulty=2)  # did you mean
    with pytest.raises(ConfigError, match="observation"):
        env.configure(observation="relative")
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(22))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(19))
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.full(22, np.nan))
    env.close()


# -- determinism ----------------------------------------------------------------------------------
def test_same_seed_same_episode_different_seed_different_field() -> None:
    actions = random_actions(15, seed=1)
    official = L2M2019Env(difficulty=2)
    relative = L2M2019Env(difficulty=2, observation="relative")
    traces = []
    for env, seed in ((official, 11), (official, 11), (relative, 11)):
        obs, _ = env.reset(seed=seed)
        trace, rewards = [obs], []
        for a in actions:
            obs, r, *_ = env.step(a)
            trace.append(obs)
            rewards.append(r)
        traces.append((np.stack(trace), rewards))
        if env is official:  # the next episode must not depend on this one's last action
            env.step(np.ones(22))
    assert np.array_equal(traces[0][0], traces[1][0]) and traces[0][1] == traces[1][1]
    assert np.array_equal(traces[2][0][:, :339], traces[0][0]) and traces[2][1] == traces[0][1]
    # relative extras: the target at the pelvis (the local field's centre) and its error
    last = traces[2][0][-1]
    d = relative.state_desc()
    np.testing.assert_allclose(last[417:419], d["v_tgt_field"][:, 5, 5], atol=1e-6)
    np.testing.assert_allclose(last[419:421], last[417:419] - last[[245, 246]], atol=1e-5)
    # another seed: another target field
    other, _ = official.reset(seed=12)
    assert not np.allclose(other[:242], traces[0][0][0, :242])
    official.close()
    relative.close()


# -- simulator failure ----------------------------------------------------------------------------
def test_simulator_failure_ends_the_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    env = L2M2019Env(difficulty=3)
    env.reset(seed=1)
    last, *_ = env.step(np.full(22, 0.2, dtype=np.float32))

    def broken() -> None:
        raise SimulationError("integrator failed (test)")

    monkeypatch.setattr(env.sim, "integrate", broken)
    for _ in range(2):  # and it stays ended until reset
        obs, r, term, trunc, info = env.step(np.full(22, 0.2, dtype=np.float32))
        assert (r, term, trunc) == (0.0, False, True)
        assert "integrator failed" in info["sim_error"] and info["official_reward"] == 0.0
        assert np.array_equal(obs, last)
    monkeypatch.undo()
    obs, _ = env.reset(seed=1)
    obs, r, term, trunc, info = env.step(np.full(22, 0.2, dtype=np.float32))
    assert np.array_equal(obs, last) and "sim_error" not in info
    env.close()


# -- memory ----------------------------------------------------------------------------------------
def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.slow
def test_resets_after_falls_do_not_leak() -> None:
    """1000 one-step episodes (the crouching pose falls at once) on one env: the resident memory
    after episode 1000 is within 20 MB of that after episode 100 (the allocator keeps freed
    pages and caches in OpenSim/SciPy settle in the first episodes; a leak of one Manager,
    state or 81 x 81 field per episode would add well over 20 MB in 900 episodes)."""
    env = L2M2019Env(difficulty=3, init_pose=CROUCH)
    start = time.perf_counter()
    a = np.zeros(22, dtype=np.float32)
    at_100 = 0.0
    for episode in range(1, 1001):
        env.reset(seed=episode)
        _, _, term, _, _ = env.step(a)
        assert term
        if episode == 100:
            at_100 = rss_mb()
    at_1000 = rss_mb()
    elapsed = time.perf_counter() - start
    print(f"1000 fall episodes: {elapsed:.1f} s, RSS {at_100:.1f} MB -> {at_1000:.1f} MB")
    assert at_1000 - at_100 < 20.0
    env.close()
