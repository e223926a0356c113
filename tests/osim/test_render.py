"""The OpenSim gait renderer (harness_osim.render) on real OpenSim: the render contract
(harness.testing.check_env), frames that follow the state (activation colours, the camera
following the pelvis, a raised pelvis raising the figure), the final frame of an ended episode,
a simulator failure, determinism, the frame rate and bad input.

Episodes are a few 0.01 s steps: the drawing is checked, not walking."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np
import pytest

pytest.importorskip("opensim", reason="opensim is not installed (pip install 'harness[osim]')")
pytest.importorskip("osim", reason="osim-rl is not installed (pip install 'harness[osim]')")
pytest.importorskip("PIL", reason="pillow is not installed (pip install 'harness[video]')")

from harness.errors import ConfigError, MissingExtraError
from harness.testing import check_env
from harness_osim import render
from harness_osim.plugin import (
    L2MConfig,
    ProstheticsConfig,
    harness_register_envs,
    make_env,
    make_one,
)

FAMILIES = {
    "Prosthetics-v0": ("prosthetics", ProstheticsConfig, 19),
    "L2M2019-v0": ("l2m", L2MConfig, 22),
}


def _spec(family: str) -> Any:
    return next(spec for spec in harness_register_envs() if spec.name == family)


TOP = 44
"""The panels' drawing starts below this row (the header's text and legend are above)."""


def _red(frame: np.ndarray, top: int = TOP) -> int:
    """Pixels of a fully active right-side muscle (render.HIGH, (230, 30, 30)), give or take,
    below row ``top`` (the header's colour bar has both ends)."""
    r, g, b = (frame[top:, :, k].astype(int) for k in range(3))
    return int(np.sum((r > 200) & (g < 70) & (b < 70)))


def _blue(frame: np.ndarray) -> int:
    """Pixels of an inactive right-side muscle (render.LOW, (40, 90, 255)), give or take."""
    r, g, b = (frame[TOP:, :, k].astype(int) for k in range(3))
    return int(np.sum((b > 220) & (r < 80) & (g < 120)))


def _rows(frame: np.ndarray, colour: tuple[int, int, int], x0: int, x1: int) -> np.ndarray:
    """The image rows (below the header) holding a pixel of exactly ``colour`` between columns
    x0 and x1."""
    hit = np.all(frame[TOP:, x0:x1] == np.array(colour, np.uint8), axis=-1)
    return TOP + np.flatnonzero(hit.any(axis=1))


@pytest.mark.parametrize("env_id", list(FAMILIES))
def test_render_contract(env_id: str) -> None:
    """harness.testing.check_env, which checks a declared renderer: one (H, W, 3) uint8 frame
    per env after reset and every step, of one shape, across an autoreset (5-step episodes),
    final frames included."""
    family, config_cls, _ = FAMILIES[env_id]
    spec = _spec(family)
    assert spec.render_modes == ("rgb_array",)
    check_env(spec, env_id, num_envs=2, steps=8, options=config_cls(time_limit=5))


def test_frames_show_activation_and_the_final_frame_of_an_episode() -> None:
    """All muscles excited for 10 steps: red muscles, no blue ones; none excited: blue, no red.
    The step that ends an episode hands over the frame of its last state (all red), while
    render() already shows the next episode's first (blue again)."""
    envs = make_env(
        "Prosthetics-v0",
        num_envs=1,
        seed=0,
        options=ProstheticsConfig(time_limit=10),
        render_mode="rgb_array",
    )
    first = envs.render()[0]
    assert first.shape == (render.HEIGHT, render.WIDTH, 3) and first.dtype == np.uint8
    assert _blue(first) > 300 and _red(first) == 0
    # the prosthesis (right leg, gold) stands right of the pelvis (+z), so in the frontal view
    # (from the front) it is on the viewer's left of the panel's centre, where the pelvis is
    gold = np.all(first[TOP:] == np.array(render.PROSTHESIS, np.uint8), axis=-1)
    columns = np.flatnonzero(gold[:, render.PANEL_WIDTH :].any(axis=0))
    assert len(columns) > 3 and columns.max() < render.PANEL_WIDTH // 2
    for t in range(10):
        _obs, _r, term, trunc, infos = envs.step(np.ones((1, 19), np.float32))
        if t < 9:
            assert not (term[0] or trunc[0])
            last = envs.render()[0]
    assert trunc[0]
    final = infos["final_info"]["final_frame"][0]
    assert final.shape == first.shape and final.dtype == np.uint8
    assert _red(final) > 300 and _blue(final) == 0
    assert _red(last) > 300 and _blue(last) == 0
    after = envs.render()[0]  # the next episode, reset inside the ending step
    assert np.array_equal(after, first)
    envs.close()


def test_the_pelvis_moves_the_figure_and_the_camera_follows_it() -> None:
    """One real state drawn as it is and moved: 0.1 m up raises every bone pixel by 15 px
    (150 px/m); 0.25 m forward leaves the figure where it is (the camera follows the pelvis) but
    slides the ground ticks of the sagittal panel, not those of the frontal one."""
    env = make_one("L2M2019-v0", L2MConfig(), "rgb_array")
    env.reset(seed=0)
    env.step(np.full(22, 0.2))
    base = env.unwrapped
    env.render()
    renderer = base._renderer
    state = render.gait_state(base, renderer.skeleton)

    def moved(offset: tuple[float, float, float]) -> np.ndarray:
        d = np.asarray(offset)
        return renderer.draw(
            dataclasses.replace(
                state,
                body_pos={name: p + d for name, p in state.body_pos.items()},
                muscles=tuple((s, p + d, a) for s, p, a in state.muscles),
            )
        )

    frame, up, forward = moved((0, 0, 0)), moved((0, 0.1, 0)), moved((0.25, 0, 0))
    assert np.array_equal(frame, renderer.draw(state))
    for x0, x1 in ((0, render.PANEL_WIDTH), (render.PANEL_WIDTH, render.WIDTH)):
        rows, rows_up = _rows(frame, render.BONE, x0, x1), _rows(up, render.BONE, x0, x1)
        assert len(rows) > 100
        assert abs((rows[0] - rows_up[0]) - 15) <= 1
        assert abs((rows[-1] - rows_up[-1]) - 15) <= 1
    figure, ground = slice(TOP, render.GROUND_Y - 2), slice(render.GROUND_Y, render.HEIGHT)
    sagittal, frontal = slice(0, render.PANEL_WIDTH), slice(render.PANEL_WIDTH, render.WIDTH)
    assert np.array_equal(frame[figure], forward[figure])
    assert not np.array_equal(frame[ground, sagittal], forward[ground, sagittal])
    assert np.array_equal(frame[ground, frontal], forward[ground, frontal])
    env.close()


def test_same_seed_and_actions_give_the_same_frames() -> None:
    """Round 2 with frequent target changes (the arrow and the text follow the seeded
    targets): two envs, same seed and actions, identical frames; another seed differs."""
    actions = np.random.default_rng(1).uniform(0.0, 1.0, (8, 1, 19)).astype(np.float32)

    def film(seed: int) -> list[np.ndarray]:
        envs = make_env(
            "Prosthetics-v0",
            num_envs=1,
            seed=seed,
            options=ProstheticsConfig(round=2, poisson_lambda=3.0),
            render_mode="rgb_array",
        )
        frames = [envs.render()[0]]
        for a in actions:
            envs.step(a)
            frames.append(envs.render()[0])
        envs.close()
        return frames

    one, two, other = film(5), film(5), film(6)
    assert all(np.array_equal(a, b) for a, b in zip(one, two, strict=True))
    assert len({f.tobytes() for f in one}) == len(one)  # every step changes the frame
    assert not all(np.array_equal(a, b) for a, b in zip(one, other, strict=True))


def test_the_printed_score_is_the_official_score_so_far() -> None:
    """The frame's score is the env's episode_score: the official rewards summed, which is
    the wrapper's episode metric ``score``; a reset starts it again."""
    env = make_one("Prosthetics-v0", ProstheticsConfig(round=2, frame_skip=2), "rgb_array")
    env.reset(seed=3)
    base = env.unwrapped
    for _ in range(3):
        env.step(np.full(19, 0.1))
    wrapper = env.env  # the CompetitionWrapper inside FinalFrame
    assert base.episode_score == wrapper.score
    assert base.episode_score != 0.0
    state = render.gait_state(base, render.Skeleton.of(base.sim))
    assert state.score == base.episode_score and state.step == 6
    env.reset(seed=3)
    assert base.episode_score == 0.0


def test_a_simulator_failure_is_drawn_from_the_last_good_state() -> None:
    """After an injected simulator failure the frame shows the last good state's skeleton,
    no muscles and the failure in red text; the ending step's final frame is that frame."""
    from harness_osim.sim import SimulationError

    env = make_one("Prosthetics-v0", ProstheticsConfig(time_limit=50), "rgb_array")
    env.reset(seed=1)
    for _ in range(5):
        env.step(np.ones(19))
    before = env.render()
    sim = env.unwrapped.sim

    def broken() -> None:
        raise SimulationError("integrator failed (injected)")

    sim.integrate = broken
    _obs, _r, _term, trunc, info = env.step(np.ones(19))
    assert trunc
    after = info["final_frame"]
    assert np.array_equal(after, env.render())
    failure_text = np.all(after == np.array(render.FAILURE, np.uint8), axis=-1)
    assert failure_text.sum() > 20 and not np.all(before == render.FAILURE, axis=-1).any()
    below_text = 80  # (the failure's red text is above)
    assert _red(before, below_text) > 300 and _red(after, below_text) == 0 and _blue(after) == 0
    assert np.array_equal(
        _rows(before, render.BONE, 0, render.WIDTH), _rows(after, render.BONE, 0, render.WIDTH)
    )
    del sim.integrate
    env.close()


@pytest.mark.parametrize(("frame_skip", "fps"), [(1, 50.0), (4, 25.0)])
def test_render_fps_plays_real_time_up_to_50(frame_skip: int, fps: float) -> None:
    envs = make_env(
        "Prosthetics-v0",
        options=ProstheticsConfig(frame_skip=frame_skip),
        render_mode="rgb_array",
    )
    assert envs.metadata["render_fps"] == pytest.approx(fps)
    assert envs.render_mode == "rgb_array"
    envs.close()


def test_without_render_mode_nothing_is_drawn() -> None:
    """Training envs: no renderer, no final frames, render() returns None."""
    env = make_one("Prosthetics-v0", ProstheticsConfig(time_limit=1))
    env.reset(seed=0)
    _obs, _r, _term, trunc, info = env.step(np.zeros(19))
    assert trunc and "final_frame" not in info
    assert env.render() is None and env.unwrapped._renderer is None
    env.close()


def test_bad_render_mode_and_missing_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"Prosthetics-v0 cannot render .*'human'.*'rgb_array'"):
        make_env("Prosthetics-v0", options=ProstheticsConfig(), render_mode="human")
    monkeypatch.setitem(sys.modules, "PIL", None)  # an import of PIL now fails
    with pytest.raises(MissingExtraError, match="video"):
        make_env("L2M2019-v0", options=L2MConfig(), render_mode="rgb_array")
