"""``harness eval --video`` and the render contract, with real envs, a real ffmpeg and real
files read back: the renderer check of ``check_env`` on classic control, MuJoCo (EGL) and
MyoSuite; a trained CartPole run filmed into an MP4 that decodes to one frame per step plus
one per episode, a GIF, a filmstrip and a line of ``evaluations.jsonl``; and the bad input
(an env that cannot render, ``--fps 0``) that exits 2 with one paragraph, the scores of the
evaluation still printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.cli import main
from harness.errors import ConfigError
from harness.plugins import collect_registry, make_plugin_manager
from harness.testing import check_env
from harness.testing.env import check_renderer

PACK = Path(__file__).resolve().parents[2] / "competitions" / "cartpole"
CLI = (sys.executable, "-m", "harness.cli")


@pytest.fixture(scope="module")
def registry() -> object:
    return collect_registry(make_plugin_manager())


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short CartPole PPO run (its policy barely trained: episodes of ~10-50 steps)."""
    out = tmp_path_factory.mktemp("runs")
    code = main(
        [
            "run",
            str(PACK),
            "--steps",
            "1024",
            "--out",
            str(out),
            "--no-progress",
            "--set",
            "name=cp",
            "--set",
            "eval_episodes=0",
            "--set",
            "trackers=['csv']",
        ]
    )
    assert code == 0
    return out / "cp"


def test_cartpole_renders_by_the_contract(registry: object) -> None:
    spec = registry.envs.get("gymnasium")  # type: ignore[attr-defined]
    assert "rgb_array" in spec.render_modes
    check_env(spec, "CartPole-v1", steps=100)  # (the renderer check included)


def test_mujoco_renders_through_egl(registry: object) -> None:
    pytest.importorskip("mujoco")
    spec = registry.envs.get("gymnasium")  # type: ignore[attr-defined]
    check_renderer(spec, "InvertedPendulum-v5", num_envs=1, steps=60)


def test_myosuite_renders_through_its_camera(registry: object) -> None:
    pytest.importorskip("myosuite")
    spec = registry.envs.get("myo")  # type: ignore[attr-defined]
    options = spec.config_cls(max_episode_steps=3)  # (a software-GL frame takes ~0.5 s here)
    check_renderer(spec, "myoChallengeDieReorientP1-v0", num_envs=1, steps=10, options=options)


def gymnasium_rendering_with(registry: object, wrap: Any) -> Any:
    """The gymnasium family with each vector env's ``render`` replaced by ``wrap(render)``
    (a renderer breaking the contract in one way, for the checker to catch)."""
    import dataclasses

    from harness_gymnasium.plugin import make_env

    def make(env_id: str, **kwargs: object) -> object:
        envs = make_env(env_id, **kwargs)  # type: ignore[arg-type]
        envs.render = wrap(envs.render)
        return envs

    return dataclasses.replace(
        registry.envs.get("gymnasium"),  # type: ignore[attr-defined]
        make_env=make,
    )


def test_the_checker_catches_a_renderer_that_changes_size(registry: object) -> None:
    """check_renderer fails a vector env whose frames change shape at an autoreset."""

    def every_other_call_one_row_short(render: Any) -> Any:
        calls = [0]

        def render_odd() -> tuple[np.ndarray, ...]:
            calls[0] += 1
            return tuple(f[1:] if calls[0] % 2 == 0 else f for f in render())

        return render_odd

    spec = gymnasium_rendering_with(registry, every_other_call_one_row_short)
    with pytest.raises(AssertionError, match="keep one frame size"):
        check_renderer(spec, "CartPole-v1", num_envs=1, steps=50)


def test_the_checker_catches_a_renderer_that_reuses_its_array(registry: object) -> None:
    """check_renderer fails a renderer that draws every frame into one array (a recorder
    keeping frames by reference would film the last frame over and over)."""

    def into_one_array(render: Any) -> Any:
        buffers: list[np.ndarray] = []

        def render_into_one() -> tuple[np.ndarray, ...]:
            frames = render()
            if not buffers:
                buffers.extend(np.empty_like(f) for f in frames)
            for buffer, frame in zip(buffers, frames, strict=True):
                buffer[:] = frame
            return tuple(buffers)

        return render_into_one

    spec = gymnasium_rendering_with(registry, into_one_array)
    with pytest.raises(AssertionError, match="return a new array per call"):
        check_renderer(spec, "CartPole-v1", num_envs=1, steps=50)


def test_a_family_without_the_mode_is_refused(registry: object) -> None:
    from harness.config import Config, RunConfig
    from harness.runtime.build import make_envs

    spec = registry.envs.get("gymnasium")  # type: ignore[attr-defined]
    config = Config(run=RunConfig(env="CartPole-v1"), algo=None, env=spec.config_cls())
    with pytest.raises(ConfigError, match="cannot render 'depth' frames"):
        make_envs(config, registry, 1, seed=None, render_mode="depth")  # type: ignore[arg-type]


def filmed(run: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``harness eval RUN --video FLAGS`` as a user runs it (exit 0 asserted), and the line it
    appended to ``evaluations.jsonl``."""
    proc = subprocess.run(
        [*CLI, "eval", str(run), "--video", *flags], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads((run / "evaluations.jsonl").read_text().splitlines()[-1])
    return proc, record


def test_eval_video_writes_a_film_gif_filmstrip_and_record(cartpole_run: Path) -> None:
    import imageio.v3 as iio
    from PIL import Image

    proc, record = filmed(cartpole_run, "--episodes", "2", "--seed", "7")
    assert "mean return" in proc.stdout and "over 2 episodes" in proc.stdout
    assert record["episodes"] == 2 and record["seed"] == 7 and record["env"] == "CartPole-v1"
    assert record["checkpoint"].startswith("checkpoints/step_")
    assert record["step"] == 1024 and record["protocol"] is None
    assert record["command"].startswith("harness eval ") and "--video" in record["command"]
    for key in ("video", "gif", "filmstrip"):
        assert (cartpole_run / record[key]).is_file(), record
        assert str(cartpole_run / record[key]) in proc.stdout
    frames = iio.imread(cartpole_run / record["video"])
    # one frame after each reset and after each step, the final state included
    assert len(frames) == sum(record["lengths"]) + 2
    assert frames.shape[1:] == (400 + 24, 600, 3)  # CartPole's 600x400 and the caption
    assert frames[0].mean() > 100  # (a white scene, not a black film)
    gif = Image.open(cartpole_run / record["gif"])
    assert gif.size[0] <= 320 and gif.n_frames > 1
    assert (cartpole_run / record["gif"]).stat().st_size < 2_000_000
    strip = Image.open(cartpole_run / record["filmstrip"])
    assert strip.size[0] > 4 * strip.size[1]  # frames side by side
    assert record["returns"] == [float(n) for n in record["lengths"]]  # CartPole: 1 per step


def test_video_width_scales_the_film_down(cartpole_run: Path) -> None:
    """--video-width 300: ffmpeg scales CartPole's 600x400 frames and their caption to 300
    px (the caption drawn at twice the 16-px line of a film under 320 px, then halved); the
    scene is the same one (a white scene with the dark cart in the middle)."""
    import imageio.v3 as iio

    _, record = filmed(cartpole_run, "--episodes", "1", "--video-width", "300")
    frames = iio.imread(cartpole_run / record["video"])
    assert frames.shape[1:] == (216, 300, 3)  # (400 + 32) / 2, 600 / 2
    assert len(frames) == record["lengths"][0] + 1
    scene = frames[0][:200].astype(int)
    assert scene.mean() > 150  # white background
    dark = np.argwhere(scene.sum(axis=2) < 200)  # the cart and the pole
    assert len(dark) > 50 and 100 < dark[:, 1].mean() < 200  # near the middle
    caption = frames[0][-10:].astype(int)
    assert caption.mean() < 80  # the dark caption strip at the bottom


def test_video_of_an_env_that_cannot_render(tmp_path: Path) -> None:
    """Exit 2 naming the env and what is missing, after the scores are printed."""
    pytest.importorskip("popgym")
    out = tmp_path / "runs"
    assert (
        main(
            [
                *("run", str(PACK), "--steps", "256", "--out", str(out), "--no-progress"),
                *("--set", "name=pg", "--set", "env=popgym-RepeatPreviousEasy-v0"),
                *("--set", "eval_episodes=0", "--set", "trackers=['csv']"),
            ]
        )
        == 0
    )
    proc = subprocess.run(
        [*CLI, "eval", str(out / "pg"), "--video", "--episodes", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "mean return" in proc.stdout and "over 2 episodes" in proc.stdout
    error = [line for line in proc.stderr.splitlines() if line.startswith("harness: error:")]
    assert len(error) == 1, proc.stderr
    assert "'popgym-RepeatPreviousEasy-v0' cannot render" in error[0]
    assert "render_modes" in error[0]
    record = json.loads((out / "pg" / "evaluations.jsonl").read_text())
    assert record["video"] is None and record["episodes"] == 2
    assert not list((out / "pg" / "videos").glob("*.mp4"))


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--video", "--fps", "0"], "--fps 0"),
        (["--fps", "30"], "give --video too"),
        (["--video", "--video-width", "8"], "--video-width 8"),
        (["--video-width", "300"], "give --video too"),
    ],
)
def test_bad_fps_exits_2_before_anything_runs(
    flags: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(tmp_path / "no-such-run"), *flags]) == 2
    err = capsys.readouterr().err
    assert needle in err and "does not exist" not in err


def test_mujoco_without_a_gl_backend_names_mujoco_gl() -> None:
    """MUJOCO_GL=osmesa fails here; make_env says which MUJOCO_GL to try."""
    pytest.importorskip("mujoco")
    code = (
        "from harness_gymnasium.plugin import make_env\n"
        "from harness.errors import ConfigError\n"
        "try:\n"
        "    make_env('InvertedPendulum-v5', render_mode='rgb_array')\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "MUJOCO_GL": "osmesa"}
    env.pop("PYOPENGL_PLATFORM", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert "MUJOCO_GL='osmesa'" in proc.stdout, proc.stdout + proc.stderr
    assert "MUJOCO_GL=egl" in proc.stdout
