"""Registers the ``envpool`` env family: EnvPool's C++ thread-pool envs (Atari, MuJoCo, ...) as
``envpool/TASK`` ids (``envpool/Pong-v5``, ``envpool/HalfCheetah-v4``).

The ``envpool/`` prefix keeps these ids apart from gymnasium's (``ALE/Pong-v5`` stays
harness_gymnasium's), and ``accepts`` goes by it alone, importing nothing. The ``[env]`` options
are EnvPool's own Atari options with defaults that match harness_gymnasium's DeepMind
preprocessing (84x84 grey, 4 stacked frames, frame skip 4 with max-pooling, up to 30 no-ops,
episodic life, reward clipping, ALE v5's sticky actions 0.25), so one pack and one network
run on either family. The vector env and its SAME_STEP autoreset are in
:mod:`harness_envpool.vector`; docs/envpool.md has the measurements.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field, fields
from typing import Any

from harness import hookimpl
from harness.cpus import cpu_share
from harness.errors import ConfigError, MissingExtraError, did_you_mean
from harness.registry import EnvSpec

log = logging.getLogger(__name__)

PREFIX = "envpool/"
"""What every id of this family starts with; the rest is EnvPool's task id."""

ATARI_OPTIONS = (
    "episodic_life",
    "reward_clip",
    "stack_num",
    "frame_skip",
    "noop_max",
    "repeat_action_probability",
    "img_height",
    "img_width",
    "use_fire_reset",
)
"""The [env] keys that are EnvPool Atari config keys of the same name."""


@dataclass
class EnvPoolConfig:
    """Options of the EnvPool env family ([env] section). The Atari options apply to Atari
    tasks (``envpool/Pong-v5``); set away from their defaults for another task they are
    refused."""

    episodic_life: bool = True
    """Atari: a lost life ends the agent's episode (the game goes on); false for evaluating
    whole games. The game's real score is logged either way (charts/game_score)."""
    reward_clip: bool = True
    """Atari: rewards become their sign; false for real game scores."""
    stack_num: int = 4
    """Atari: frames per observation, which is (stack_num, img_height, img_width) uint8."""
    frame_skip: int = 4
    """Atari: emulator frames per agent step (the action repeats; the last two are
    max-pooled)."""
    noop_max: int = 30
    """Atari: a reset plays 1..noop_max no-op frames (random) before the first observation."""
    repeat_action_probability: float = 0.25
    """Atari: sticky actions, ALE v5's default 0.25 (EnvPool's own default is 0.0, the
    DeepMind 2015 protocol)."""
    img_height: int = 84
    """Atari: observation height (area-resampled)."""
    img_width: int = 84
    """Atari: observation width (area-resampled)."""
    use_fire_reset: bool = True
    """Atari: press FIRE after a reset in games that wait for it (Breakout)."""
    max_episode_steps: int | None = None
    """Agent steps after which an episode is truncated; unset: the task's (Atari: 27000, that
    is 108000 frames as ALE v5; MuJoCo: 1000)."""
    num_threads: int = 0
    """Threads of EnvPool's pool stepping this process's envs; 0: this process's CPU share
    (its affinity), at most num_envs. On a farm several actors share a host: set 1 there."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Further EnvPool config keys for the task (e.g. {ctrl_cost_weight = 0.05} for a MuJoCo
    task, {full_action_space = true} for Atari); envpool.make_spec(TASK).config lists
    them."""

    def __post_init__(self) -> None:
        for name in ("stack_num", "frame_skip", "img_height", "img_width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: expected >= 1")
        if self.noop_max < 1:
            raise ValueError(f"noop_max = {self.noop_max}: expected >= 1 (EnvPool draws 1..N)")
        if not 0.0 <= self.repeat_action_probability <= 1.0:
            raise ValueError(
                f"repeat_action_probability = {self.repeat_action_probability}: expected a "
                f"probability in [0, 1]"
            )
        if self.num_threads < 0:
            raise ValueError(f"num_threads = {self.num_threads}: expected >= 0 (0: automatic)")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ValueError(f"max_episode_steps = {self.max_episode_steps}: expected >= 1")


def import_envpool(needed_for: str = "") -> Any:
    """``envpool``, imported without jax: EnvPool imports jax (when installed) for its XLA
    interface, which harness never uses, and that was 1.7 s of its 3.0 s import here (every
    farm actor pays it). jax is hidden only for this import and only when nothing has
    imported it yet. A missing EnvPool names the extra to install."""
    hide = "jax" not in sys.modules
    if hide:
        sys.modules["jax"] = None  # type: ignore[assignment]  # (import jax -> ImportError)
    try:
        import envpool
    except ImportError:  # (EnvPool or one of its dependencies: the extra brings both)
        raise MissingExtraError("envpool", "envpool", needed_for) from None
    finally:
        if hide and sys.modules.get("jax", 0) is None:
            del sys.modules["jax"]
    return envpool


def accepts(env_id: str) -> bool:
    """Ids ``envpool/TASK`` (by the prefix alone: no import)."""
    return env_id.startswith(PREFIX) and len(env_id) > len(PREFIX)


def known_ids() -> list[str]:
    try:
        envpool = import_envpool()
    except MissingExtraError:
        return []
    return [PREFIX + task for task in envpool.list_all_envs()]


def make_kwargs(
    envpool: Any, env_id: str, task: str, options: EnvPoolConfig, num_envs: int
) -> dict[str, Any]:
    """EnvPool config keys for ``task`` from ``options``: the Atari options where the task
    has them, ``max_episode_steps``, ``num_threads`` and ``kwargs``; an option the task
    does not have is refused when set away from its default."""
    defaults = {f.name: f.default for f in fields(EnvPoolConfig)}
    task_keys = set(envpool.make_spec(task).config._fields)
    out: dict[str, Any] = {}
    for name in ATARI_OPTIONS:
        value = getattr(options, name)
        if name in task_keys:
            out[name] = value
        elif value != defaults[name]:
            raise ConfigError(
                f"[env] {name} = {value!r}: {env_id} has no such EnvPool option (it is an "
                f"Atari option). Remove it from [env]."
            )
    if options.max_episode_steps is not None:
        out["max_episode_steps"] = options.max_episode_steps
    threads = options.num_threads or cpu_share()
    out["num_threads"] = min(threads, num_envs)
    reserved = {"num_envs", "batch_size", "seed", "env_seed", "gym_reset_return_info"}
    for key, value in options.kwargs.items():
        if key in reserved or key in out:
            raise ConfigError(
                f"[env] kwargs sets {key!r}, which the envpool family sets itself "
                f"({'the [env] option of that name' if key in out else 'from the run'}). "
                f"Remove it from kwargs."
            )
        if key not in task_keys:
            raise ConfigError(
                f"[env] kwargs has {key!r}, not an EnvPool config key of {env_id}."
                f"{did_you_mean(key, task_keys)}"
            )
        out[key] = value
    return out


def make_env(
    env_id: str,
    *,
    num_envs: int = 1,
    seed: int | None = None,
    vector: str = "sync",
    options: EnvPoolConfig | None = None,
) -> Any:
    """An :class:`~harness_envpool.vector.EnvPoolVectorEnv` of ``num_envs`` envs; its pool is
    built at the first ``reset`` (seeded from ``seed`` unless that reset gives one). ``vector``
    has no effect: EnvPool always steps every env on its own thread pool."""
    if vector not in ("sync", "async"):
        raise ConfigError(f"[run] vector = {vector!r} must be 'sync' or 'async'.")
    if not accepts(env_id):
        raise ConfigError(f"{env_id!r} is not an envpool id: expected {PREFIX}TASK.")
    envpool = import_envpool(f"the EnvPool env {env_id!r}")
    task = env_id[len(PREFIX) :]
    tasks = envpool.list_all_envs()
    if task not in tasks:
        raise ConfigError(
            f"EnvPool has no task {task!r} (env = {env_id!r}).{did_you_mean(task, tasks)} "
            f"Its ids are envpool/TASK for TASK in envpool.list_all_envs()."
        )
    kwargs = make_kwargs(envpool, env_id, task, options or EnvPoolConfig(), num_envs)
    from harness_envpool.vector import EnvPoolVectorEnv

    try:
        return EnvPoolVectorEnv(envpool, task, num_envs, kwargs, seed=seed)
    except (AssertionError, ValueError, TypeError, RuntimeError) as exc:  # EnvPool's checks
        raise ConfigError(f"EnvPool refused {env_id} with {kwargs}: {exc}") from None


@hookimpl
def harness_register_envs() -> list[EnvSpec]:
    return [
        EnvSpec(
            "envpool",
            make_env=make_env,
            accepts=accepts,
            config_cls=EnvPoolConfig,
            known_ids=known_ids,
            description="EnvPool's C++ thread-pool envs as envpool/TASK (envpool/Pong-v5, "
            "envpool/HalfCheetah-v4): Atari with the DeepMind preprocessing, MuJoCo, ...",
        )
    ]
