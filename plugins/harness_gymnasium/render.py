"""Rendering for ``harness eval --video`` (the render contract, ``EnvSpec.render_modes``):
the checks and the one wrapper a gymnasium-style env family needs to hand out ``rgb_array``
frames, shared by the gymnasium and MyoSuite families.

- :func:`render_modes_of`: an id's ``metadata["render_modes"]``, read from its registered
  creator without building it, so an id that cannot render is refused by name before any env
  (or env process) exists;
- :class:`FinalFrame`: a vector env with SAME_STEP autoreset resets an env inside the step that
  ends its episode, so ``render()`` after that step already shows the next episode; this
  wrapper renders the state the episode ended in and hands it over in the ending step's info
  (``info["final_frame"]``, which the vector env merges into ``infos["final_info"]``), so a
  film of an episode of T steps has its T + 1 frames. It renders only on ending steps, and
  only envs made with a render mode get it: training envs are not wrapped;
- :func:`probe_render`: one ``reset`` and ``render`` right after the vector env is made, so
  what is missing (pygame, an OpenGL context for MuJoCo) is named by ``make_env`` as a
  ``ConfigError`` / ``MissingExtraError`` rather than met half-way through an evaluation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from harness.errors import ConfigError, MissingExtraError, missing_extra

FINAL_FRAME = "final_frame"
"""Info key of the frame of the state an episode ended in (see :class:`FinalFrame`)."""

RENDERING_IDS = "CartPole-v1, Acrobot-v1, Pendulum-v1, ALE/Pong-v5, InvertedPendulum-v5"
"""Ids named when one cannot render (each renders ``rgb_array`` here)."""


def render_modes_of(env_id: str) -> list[str] | None:
    """The render modes ``env_id``'s creator declares (``metadata["render_modes"]``), None
    when it declares none readable without building it (a creator function, a metadata
    property)."""
    spec = gym.spec(env_id)
    creator: Any = spec.entry_point
    if isinstance(creator, str):
        from gymnasium.envs.registration import load_env_creator

        try:
            creator = load_env_creator(creator)
        except (ImportError, AttributeError):  # (make_env names what is missing)
            return None
    metadata = getattr(creator, "metadata", None)
    if not isinstance(metadata, dict):
        return None
    modes = metadata.get("render_modes")
    return list(modes) if isinstance(modes, Sequence) else None


def check_render_mode(env_id: str, render_mode: str) -> None:
    """Refuse an id whose metadata says it cannot render ``render_mode`` (POPGym's ids
    declare ``render_modes = []``)."""
    modes = render_modes_of(env_id)
    if modes is not None and render_mode not in modes:
        raise ConfigError(
            f"The env {env_id!r} cannot render {render_mode!r} frames: its "
            f'metadata["render_modes"] is {modes} (no {render_mode!r}), so there is nothing to '
            f"film. Evaluate it without --video; ids that render include {RENDERING_IDS}."
        )


class FinalFrame(gym.Wrapper[Any, Any, Any, Any]):
    """Puts ``render()`` of the state an episode ended in into that step's info (see the
    module docstring); every other step passes through untouched."""

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            info = {**info, FINAL_FRAME: self.env.render()}
        return obs, reward, terminated, truncated, info


def probe_render(envs: Any, env_id: str, seed: int | None) -> None:
    """Reset ``envs`` (with ``seed``) and render once: frames must be one ``(H, W, 3)``
    uint8 array per env. A renderer that cannot start is turned into the error that says
    what to install or set (:func:`render_error`); ``envs`` is closed then."""
    try:
        envs.reset(seed=seed)
        frames = envs.render()
    except Exception as exc:
        envs.close()
        raise render_error(exc, env_id) from exc
    n = envs.num_envs
    bad = frames is None or len(frames) != n
    if not bad:
        bad = any(
            not isinstance(f, np.ndarray) or f.ndim != 3 or f.shape[2] != 3 or f.dtype != np.uint8
            for f in frames
        )
    if bad:
        envs.close()
        got = (
            "None"
            if frames is None
            else f"{len(frames)} item(s) "
            + ", ".join(
                f"{type(f).__name__} {getattr(f, 'shape', '')} {getattr(f, 'dtype', '')}"
                for f in frames[:2]
            )
        )
        raise ConfigError(
            f"The env {env_id!r} cannot render 'rgb_array' frames: render() of its {n} env(s) "
            f"returned {got}, expected one (H, W, 3) uint8 array per env."
        )


def render_error(exc: BaseException, env_id: str) -> Exception:
    """The error naming what rendering ``env_id`` needs, for ``exc`` raised by its first
    ``render()``: a missing package (pygame for classic control) names the ``video`` extra;
    anything else from a MuJoCo env is an OpenGL context that could not be made (which
    ``MUJOCO_GL`` to try); other failures name the env and the exception."""
    cause = exc.__cause__ or exc if isinstance(exc, gym.error.DependencyNotInstalled) else exc
    if isinstance(cause, ModuleNotFoundError) or isinstance(exc, gym.error.DependencyNotInstalled):
        found = missing_extra(cause, f"rendering the env {env_id!r} (harness eval --video)")
        if found is not None:
            return found
        name = getattr(cause, "name", None) or "pygame"
        return MissingExtraError("video", name, f"rendering the env {env_id!r}")
    return gl_error(exc, env_id) or ConfigError(
        f"The env {env_id!r} cannot render 'rgb_array' frames: {type(exc).__name__}: {exc}."
    )


def gl_error(exc: BaseException, env_id: str) -> ConfigError | None:
    """The error naming ``MUJOCO_GL`` for ``exc`` raised by MuJoCo's or PyOpenGL's code (an
    OpenGL backend that could not load or make a context), else None."""
    if not _is_mujoco_error(exc):
        return None
    gl = os.environ.get("MUJOCO_GL")
    shown = f"MUJOCO_GL={gl!r}" if gl is not None else "MUJOCO_GL unset"
    return ConfigError(
        f"The env {env_id!r} cannot render: MuJoCo could not load OpenGL or make a context "
        f"with {shown} ({type(exc).__name__}: {exc}). Headless, set MUJOCO_GL=egl (EGL "
        f"through Mesa or an NVIDIA driver; osmesa does not work here), or MUJOCO_GL=glfw "
        f"where there is a display; set it before the command starts."
    )


def _is_mujoco_error(exc: BaseException) -> bool:
    """Whether ``exc`` came from MuJoCo's or PyOpenGL's rendering code."""
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.startswith(("mujoco", "OpenGL", "gymnasium.envs.mujoco")):
            return True
        tb = tb.tb_next
    return "MUJOCO_GL" in str(exc) or "OpenGL" in str(exc)
