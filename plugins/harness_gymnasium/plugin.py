"""Registers the ``gymnasium`` env family: every id in gymnasium's registry.

Vector envs use gymnasium's SAME_STEP autoreset: the step that ends an episode returns the reset
observation and puts the true final observation in ``infos["final_obs"]``, which is what
harness's runner expects from every env plugin (see harness.testing.check_env).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any

from harness import hookimpl
from harness.errors import ConfigError, MissingExtraError, missing_extra
from harness.registry import EnvSpec


@dataclass
class GymConfig:
    """Options of the gymnasium env family ([env] section)."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to gymnasium.make (e.g. {continuous = true})."""
    max_episode_steps: int | None = None
    """Override the registered time limit."""
    atari: bool | None = None
    """DeepMind Atari preprocessing (harness_gymnasium.atari: noop reset, frame skip 4 with
    max-pooling, grayscale 84x84, frame stack, episodic life, reward clipping, fire reset);
    unset: on for ALE/ ids."""
    frame_stack: int = 4
    """Atari: frames per observation, which is (frame_stack, 84, 84) uint8."""
    episodic_life: bool = True
    """Atari: a lost life ends the agent's episode (the game goes on); false for evaluating
    whole games."""
    clip_rewards: bool = True
    """Atari: rewards become their sign; false for real game scores."""
    sticky_actions: float = 0.25
    """Atari: ALE v5's repeat_action_probability (0.25 as v5 and Machado et al. 2018; 0.0 is
    the DeepMind 2015 protocol)."""
    obs_keep: list[int] = field(default_factory=list)
    """Keep only these entries (0-based) of a flat Box observation and hide the rest; empty:
    all. CartPole-v1 with [0, 2] (position and angle, no velocities) is the standard
    partially observed task a policy needs memory for (``algo.recurrent``)."""

    def __post_init__(self) -> None:
        if any(not isinstance(i, int) or i < 0 for i in self.obs_keep) or len(
            set(self.obs_keep)
        ) != len(self.obs_keep):
            raise ValueError(f"obs_keep = {self.obs_keep}: expected distinct indices >= 0")


def _gym() -> Any:
    """gymnasium, with harness's own ids registered (once)."""
    import gymnasium as gym

    if "harness/Delay-v0" not in gym.registry:
        gym.register("harness/Delay-v0", entry_point="harness_gymnasium.delay:DelayEnv")
    return gym


def _register_popgym() -> bool:
    """Import popgym, which registers its ``popgym-...`` ids (only when one is asked for:
    it imports its 45 envs); False without popgym."""
    try:
        import popgym  # type: ignore[import-untyped, unused-ignore]  # noqa: F401
    except ImportError:
        return False
    return True


def accepts(env_id: str) -> bool:
    gym = _gym()
    if env_id.startswith("popgym-") and env_id not in gym.registry and not _register_popgym():
        return True  # ours, so that make_env names the extra to install
    if env_id.startswith("ALE/") and env_id not in gym.registry:
        from harness_gymnasium.atari import register_ale

        # (only when asked for: importing ale-py costs every other run 30 ms); without ale-py
        # the id is still ours, so that make_env names the extra to install
        if not register_ale():
            return True

    try:
        gym.spec(env_id)
    except gym.error.Error:
        return False
    return True


def known_ids() -> list[str]:
    gym = _gym()
    from harness_gymnasium.atari import register_ale

    register_ale()  # the ALE ids too, where ale-py is installed
    return list(gym.registry)


def make_env(
    env_id: str,
    *,
    num_envs: int = 1,
    seed: int | None = None,
    vector: str = "sync",
    options: GymConfig | None = None,
    render_mode: str | None = None,
) -> Any:
    """A gymnasium VectorEnv with SAME_STEP autoreset, reset with ``seed`` when given. With
    ``render_mode="rgb_array"`` its ``render()`` gives one frame per env (Atari: ALE's colour
    screen, not the 84x84 observation), ending steps carry their final frame
    (:class:`harness_gymnasium.render.FinalFrame`), and an id that cannot render is refused
    here (:mod:`harness_gymnasium.render`)."""
    from gymnasium.vector import AutoresetMode

    gym = _gym()

    options = options or GymConfig()
    if vector not in ("sync", "async"):
        raise ConfigError(f"[run] vector = {vector!r} must be 'sync' or 'async'.")
    if render_mode is not None and render_mode not in RENDER_MODES:
        raise ConfigError(
            f"render_mode = {render_mode!r}: the gymnasium family renders "
            f"{', '.join(RENDER_MODES)} (frames, headless) only."
        )
    make_kwargs = dict(options.kwargs)
    if options.max_episode_steps is not None:
        make_kwargs["max_episode_steps"] = options.max_episode_steps
    if render_mode is not None:
        make_kwargs["render_mode"] = render_mode
    atari = options.atari if options.atari is not None else env_id.startswith("ALE/")
    accepts(env_id)  # (registers the ALE and popgym ids when asked for one)
    if env_id.startswith("popgym-") and env_id not in gym.registry:
        raise MissingExtraError("popgym", "popgym", f"the POPGym env {env_id!r}")
    if env_id.startswith("ALE/") and env_id not in gym.registry:
        from harness_gymnasium.atari import register_ale

        if not register_ale():
            raise MissingExtraError("atari", "ale_py", f"the Atari env {env_id!r}")
    if render_mode is not None:
        _prepare_render(env_id, render_mode)
    try:
        make_one: Any = functools.partial(gym.make, env_id, **make_kwargs)
        if atari:
            from harness_gymnasium.atari import make_atari

            make_one = functools.partial(
                make_atari,
                env_id,
                frame_stack=options.frame_stack,
                episodic_life=options.episodic_life,
                clip_rewards=options.clip_rewards,
                sticky_actions=options.sticky_actions,
                **make_kwargs,
            )
        make_one = functools.partial(_one_hot_discrete, make_one)
        if options.obs_keep:
            make_one = functools.partial(_keep_entries, make_one, tuple(options.obs_keep), env_id)
        if render_mode is not None:
            from harness_gymnasium.render import FinalFrame

            make_one = functools.partial(_wrapped, FinalFrame, make_one)
        gym.spec(env_id)  # an unknown id fails here, before any env process starts
        if vector == "sync":  # gymnasium's SyncVectorEnv, with a leaner step (see vector.py)
            from harness_gymnasium.vector import LeanSyncVectorEnv

            envs = LeanSyncVectorEnv([make_one] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
        else:  # (the same wrapped constructor as the sync path)
            envs = gym.vector.AsyncVectorEnv(
                [make_one] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP
            )
    except TypeError as exc:
        if render_mode is not None and "render_mode" in str(exc):
            raise ConfigError(
                f"The env {env_id!r} cannot render: its constructor takes no render_mode "
                f"({exc}). Evaluate it without --video."
            ) from None
        raise ConfigError(f"[env] kwargs {make_kwargs} do not fit {env_id}: {exc}.") from None
    except gym.error.DependencyNotInstalled as exc:  # gymnasium's MuJoCo, Box2D, ... envs
        missing = missing_extra(exc.__cause__ or exc, f"the env {env_id!r}")
        if missing is None:
            raise ConfigError(f"The env {env_id!r} cannot be made here: {exc}") from exc
        raise missing from exc
    except (ImportError, AttributeError, RuntimeError) as exc:
        # importing mujoco binds its OpenGL backend from MUJOCO_GL: a backend that cannot
        # load (osmesa here) fails the import itself, before any frame
        from harness_gymnasium.render import gl_error

        error = gl_error(exc, env_id)
        if error is None:
            raise
        raise error from exc
    if render_mode is not None:
        from harness_gymnasium.render import probe_render

        if atari:  # an agent step is frame_skip (4) emulator frames of ALE's 60 per second
            envs.metadata["render_fps"] = 60 / 4
        probe_render(envs, env_id, seed)  # (it resets with seed)
    if seed is not None:
        if render_mode is None:
            envs.reset(seed=seed)
        envs.action_space.seed(seed)
    return envs


RENDER_MODES = ("rgb_array",)
"""What ``make_env(render_mode=...)`` takes (``EnvSpec.render_modes``): frames; 'human' would
open a window."""


def _prepare_render(env_id: str, render_mode: str) -> None:
    """Before any env is built for frames: refuse an id that declares no such render mode,
    and give MuJoCo envs a headless OpenGL backend. gymnasium's MuJoCo renderer reads
    ``MUJOCO_GL`` when it makes its context, at the first ``render()``; ``egl`` works here
    (through Mesa), ``osmesa`` failed, glfw needs a display. A value the user set stands."""
    from harness_gymnasium.render import check_render_mode

    check_render_mode(env_id, render_mode)
    entry = _gym().spec(env_id).entry_point
    where = entry if isinstance(entry, str) else getattr(entry, "__module__", "")
    if "mujoco" in where:
        os.environ.setdefault("MUJOCO_GL", "egl")
    # pygame (classic control) draws into an off-screen surface, but its init() still probes
    # a display and sound card and prints SDL's "XDG_RUNTIME_DIR is invalid" on a headless
    # machine; the dummy drivers make no window and print nothing
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")


def _wrapped(wrapper: Any, make_one: Any) -> Any:
    """``wrapper(make_one())``: a wrapper applied in each env slot (picklable for async)."""
    return wrapper(make_one())


def _one_hot_discrete(make_one: Any) -> Any:
    """``make_one()``, with ``Discrete`` / ``MultiDiscrete`` observations (POPGym's memory
    tasks, FrozenLake) one-hot encoded into a flat Box: harness's networks take flat float
    observations, and an index given as a number would order unordered symbols."""
    import gymnasium as gym

    env = make_one()
    if isinstance(env.observation_space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        return gym.wrappers.FlattenObservation(env)
    return env


def _keep_entries(make_one: Any, keep: tuple[int, ...], env_id: str) -> Any:
    """``make_one()`` whose flat Box observations keep only the entries ``keep`` (``[env]
    obs_keep``)."""
    import gymnasium as gym
    import numpy as np

    env = make_one()
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        env.close()
        raise ConfigError(
            f"[env] obs_keep needs flat Box observations; {env_id} has {space}: remove obs_keep."
        )
    if max(keep) >= space.shape[0]:
        env.close()
        raise ConfigError(
            f"[env] obs_keep = {list(keep)}: {env_id}'s observations have {space.shape[0]} "
            f"entries (indices 0..{space.shape[0] - 1})."
        )
    index = np.asarray(keep)
    kept = gym.spaces.Box(space.low[index], space.high[index], dtype=space.dtype)
    return gym.wrappers.TransformObservation(env, lambda obs: obs[index], kept)


@hookimpl
def harness_register_envs() -> list[EnvSpec]:
    return [
        EnvSpec(
            "gymnasium",
            make_env=make_env,
            accepts=accepts,
            config_cls=GymConfig,
            known_ids=known_ids,
            render_modes=RENDER_MODES,
            fallback=True,  # MyoSuite's ids are in gymnasium's registry too, once imported
            description="any id in gymnasium's registry (classic control, box2d, mujoco, ale) "
            "and harness/Delay-v0 (fixed step latency, for farm benchmarks)",
        )
    ]
