"""What the two OpenSim competition envs have in common: :class:`CompetitionEnv`.

``Prosthetics-v0`` (:mod:`harness_osim.prosthetics`) and ``L2M2019-v0``
(:mod:`harness_osim.l2m`) follow one contract, and this class holds the logic that contract
makes identical:

* Rule options: checked when given (an unknown name is an error with a suggestion;
  ``observation`` fixes ``observation_space`` and cannot change after construction), changed by
  :meth:`~CompetitionEnv.configure` and applied at the next :meth:`~CompetitionEnv.reset`.
* Reset: seeding, the episode's random task drawn from ``np_random``, the muscle excitations
  zeroed before the simulator resets (so that an episode depends only on its seed and its own
  actions), the first observation.
* Step: the action check (shape, finite values), one integration step with OpenSim's
  failures turned into :class:`~harness_osim.sim.SimulationError`, the non-finite observation
  check, and the simulator-failure path: the episode ends as truncated with reward 0, the last
  good observation and ``info["sim_error"]``, and further steps repeat that until reset.
* The accessors :meth:`~CompetitionEnv.state_desc`, :meth:`~CompetitionEnv.prev_state_desc`,
  :meth:`~CompetitionEnv.activations`, :attr:`~CompetitionEnv.episode_score`,
  :attr:`~CompetitionEnv.sim_failure` and :meth:`~CompetitionEnv.close`.
* Rendering: with ``render_mode = "rgb_array"`` (set after construction, as
  ``harness_osim.plugin.make_env`` does), :meth:`~CompetitionEnv.render` draws the current state
  (:mod:`harness_osim.render`).

The rules themselves stay in the subclasses, through a few hooks: which options there are and
how each is checked (:meth:`~CompetitionEnv._check_rule_option`) and applied
(:meth:`~CompetitionEnv._apply_options`), the episode's task and initial pose, the per-episode
state built at reset (:meth:`~CompetitionEnv._first_state`), a step's official reward and info
(:meth:`~CompetitionEnv._advance`), the observation and the target velocity.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from harness.errors import ConfigError, did_you_mean
from harness_osim.sim import OsimSim, SimulationError

OBSERVATIONS = ("official", "relative")
"""The observation kinds both envs offer (fixed at construction)."""

StepResult = tuple[np.ndarray, float, bool, bool, dict[str, Any]]


def is_int(value: Any) -> bool:
    """An integer option value: ``int`` or a NumPy integer, but not ``bool``."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


class CompetitionEnv(gym.Env[np.ndarray, np.ndarray]):
    """The shared part of the OpenSim competition envs (see the module docstring).

    A subclass sets :attr:`env_id`, :attr:`model_file` and :attr:`rule_options`, calls
    ``super().__init__`` first (which checks the options and loads the model) and then builds
    its own parts, setting ``observation_space``, ``_desc`` and ``_obs``. It fills in the hooks
    below; the hooks that raise :class:`NotImplementedError` here are required.
    """

    env_id: ClassVar[str]
    """The gymnasium id, which starts every error message."""
    model_file: ClassVar[str]
    """The model file of the ``osim-rl`` package."""
    rule_options: ClassVar[tuple[str, ...]]
    """The options :meth:`configure` may change between episodes, in the order messages list
    them."""

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 50}  # noqa: RUF012
    """One frame per 0.01 s step played at 50 fps: half speed, which shows a gait cycle well
    (100 fps is past what GIF players honour: browsers slow frame delays under 20 ms to 100 ms)."""

    time_limit: int
    _obs: np.ndarray

    def __init__(self, *, observation: str, options: dict[str, Any]) -> None:
        if observation not in OBSERVATIONS:
            raise ConfigError(
                f"{self.env_id} option observation={observation!r} is not allowed; allowed "
                f"values: {', '.join(OBSERVATIONS)}."
            )
        self._options: dict[str, Any] = self._check_rule_options(options)
        self.observation_kind = observation
        self.sim = OsimSim(self.model_file, accuracy=self._options["accuracy"])
        self.action_space = gym.spaces.Box(0.0, 1.0, (self.sim.n_muscles,), np.float32)
        self._desc: dict[str, Any] = {}
        self._prev_desc: dict[str, Any] | None = None
        self._failure: str | None = None
        self._needs_reset = True
        self._score = 0.0
        self._renderer: Any = None

    # -- options -------------------------------------------------------------------------------
    def configure(self, **changes: Any) -> None:
        """Change rule options (:attr:`rule_options`) from the next :meth:`reset` on. Bad keys
        or values raise ConfigError and change nothing. The observation sizes do not depend on
        them."""
        self._options.update(self._check_rule_options(changes))

    def _check_rule_options(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Validate rule options (those :meth:`configure` accepts); returns the checked values."""
        checked: dict[str, Any] = {}
        for key, value in changes.items():
            if key == "observation":
                raise ConfigError(
                    f"{self.env_id} option 'observation' cannot change after construction: it "
                    f"fixes observation_space. Create a new env instead."
                )
            if key not in self.rule_options:
                raise ConfigError(
                    f"{self.env_id} has no option {key!r}; options that can change between "
                    f"episodes: {', '.join(self.rule_options)}."
                    f"{did_you_mean(key, self.rule_options)}"
                )
            checked[key] = self._check_rule_option(key, value)
        return checked

    def _check_rule_option(self, key: str, value: Any) -> Any:
        """Hook: the checked value of rule option ``key`` (one of :attr:`rule_options`), or
        ConfigError."""
        raise NotImplementedError

    def _check_time_limit(self, value: Any, per: str, limits: dict[int, int]) -> int | None:
        """The ``time_limit`` option: a positive number of steps, or None for the official
        limit of the ``per`` option (``limits``)."""
        if value is None:
            return None
        if not is_int(value) or value < 1:
            raise ConfigError(
                f"{self.env_id} option time_limit={value!r} is not allowed; allowed values: a "
                f"positive number of steps, or None for the {per}'s limit ({limits})."
            )
        return int(value)

    def _check_positive(self, name: str, value: Any) -> float:
        """A real-valued option that must be finite and > 0 (``accuracy``, for instance)."""
        ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(
            value, bool
        )
        if not ok or not math.isfinite(float(value)) or float(value) <= 0.0:
            raise ConfigError(
                f"{self.env_id} option {name}={value!r} is not allowed; allowed values: a finite "
                f"number > 0."
            )
        return float(value)

    def _apply_options(self) -> None:
        """Hook: make the current options the episode's rules (``time_limit``, the simulator's
        accuracy, ...); called at construction by the subclass and at every reset."""
        raise NotImplementedError

    # -- gymnasium API ---------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode. ``options`` may hold rule options, applied like :meth:`configure`
        (they persist for later episodes)."""
        super().reset(seed=seed)
        if options:
            self.configure(**options)
        self._apply_options()
        self._draw_task()
        # OpenSim's integrator starts from the controls in place when the Manager is
        # initialised (the previous episode's last action), which changes the first steps; fix
        # them at zero so that an episode depends only on the seed and its own actions.
        self.sim.actuate(np.zeros(self.sim.n_muscles))
        self.sim.reset(self._reset_pose())
        self._failure = None
        self._score = 0.0
        self._prev_desc = None
        self._desc, info = self._first_state()
        self._obs = self._observe(self._desc)
        self._needs_reset = False
        return self._obs.copy(), info

    def step(self, action: Any) -> StepResult:
        if self._needs_reset:
            raise RuntimeError(f"{self.env_id}: call reset() before step()")
        excitation = self._check_action(action)
        if self._failure is not None:
            return self._failed_step()
        try:
            result = self._advance(excitation)
            self._score += result[1]
            return result
        except SimulationError as exc:
            self._failure = str(exc)
            logging.getLogger(type(self).__module__).warning(
                "%s episode ended by a simulator failure: %s", self.env_id, self._failure
            )
            return self._failed_step()

    def render(self) -> np.ndarray | None:
        """With ``render_mode == "rgb_array"``: a ``(360, 640, 3)`` uint8 drawing of the current
        state (:mod:`harness_osim.render`); otherwise None (gymnasium's default)."""
        if self.render_mode != "rgb_array":
            return None
        if self._renderer is None:
            from harness_osim.render import GaitRenderer

            self._renderer = GaitRenderer.of(self)
        frame: np.ndarray = self._renderer.render(self)
        return frame

    def close(self) -> None:
        """Drop the integrator; the env can still be reset (nothing else holds resources)."""
        self.sim.manager = None
        self._needs_reset = True

    # -- accessors for shaping and featurisation ------------------------------------------------
    def state_desc(self) -> dict[str, Any]:
        """osim-rl's state dictionary of the current step, plus what the env adds to it (see
        the env's docstring). After a simulator failure: the last good step's."""
        return self._desc

    def prev_state_desc(self) -> dict[str, Any] | None:
        """The state dictionary before the last step (None right after reset)."""
        return self._prev_desc

    @property
    def episode_score(self) -> float:
        """The official rewards of this episode so far, summed (a failed step adds 0)."""
        return self._score

    @property
    def sim_failure(self) -> str | None:
        """Why the simulator failed this episode, or None."""
        return self._failure

    def target_velocity(self) -> np.ndarray:
        """Hook: the target velocity (ground frame, shape (3,)) the last step's reward compared
        the pelvis velocity with (after reset: the first step's)."""
        raise NotImplementedError

    def activations(self) -> np.ndarray:
        """The muscle activations of the current step, in action order (``[i]`` belongs to
        ``action[i]``)."""
        muscles = self._desc["muscles"]
        return np.array([muscles[m]["activation"] for m in self._action_muscles()])

    # -- hooks and helpers for the subclasses ---------------------------------------------------
    def _action_muscles(self) -> Sequence[str]:
        """The model's muscle names in action order (default: the model's order)."""
        return self.sim.muscle_names

    def _draw_task(self) -> None:
        """Hook: draw this episode's task (targets) from ``np_random``; called at reset, before
        the simulator resets."""
        raise NotImplementedError

    def _reset_pose(self) -> Callable[[Any, Any], None] | None:
        """The ``pose`` callback of :meth:`OsimSim.reset` (default None: the model's pose)."""
        return None

    def _first_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Hook: after the simulator's reset, start the episode's own state and return the
        first state dictionary and the reset info."""
        raise NotImplementedError

    def _advance(self, excitation: np.ndarray) -> StepResult:
        """Hook: one step with a checked action (:meth:`_simulate`, the official reward, the
        observation by :meth:`_observe_finite`); a :class:`SimulationError` raised here ends the
        episode as a simulator failure."""
        raise NotImplementedError

    def _observe(self, desc: dict[str, Any]) -> np.ndarray:
        """Hook: the observation (float32) of a state dictionary."""
        raise NotImplementedError

    def _failure_info(self) -> dict[str, Any]:
        """What a failed step's info holds besides ``official_reward``, ``target_velocity`` and
        ``sim_error`` (default: nothing)."""
        return {}

    def _simulate(self, excitation: np.ndarray) -> dict[str, Any]:
        """Apply the excitations (model muscle order), integrate one step and read the state
        dictionary; OpenSim's failures raise :class:`SimulationError`."""
        self.sim.actuate(excitation)
        self.sim.integrate()
        try:
            return self.sim.state_desc()
        except RuntimeError as exc:  # OpenSim raises RuntimeError when realizing a bad state
            if isinstance(exc, SimulationError):
                raise
            raise SimulationError(f"OpenSim failed at step {self.sim.istep}: {exc}") from exc

    def _observe_finite(self, desc: dict[str, Any]) -> np.ndarray:
        """:meth:`_observe`, with a non-finite observation raised as :class:`SimulationError`."""
        obs = self._observe(desc)
        if not np.all(np.isfinite(obs)):
            raise SimulationError(f"non-finite observation at step {self.sim.istep}")
        return obs

    def _failed_step(self) -> StepResult:
        info: dict[str, Any] = {
            "official_reward": 0.0,
            "target_velocity": self.target_velocity(),
            **self._failure_info(),
            "sim_error": self._failure,
        }
        return self._obs.copy(), 0.0, False, True, info

    def _check_action(self, action: Any) -> np.ndarray:
        a = np.asarray(action, dtype=np.float64)
        names = self._action_muscles()
        if a.shape != self.action_space.shape:
            raise ValueError(
                f"{self.env_id} expects an action of shape {self.action_space.shape} (one "
                f"excitation per muscle: {', '.join(names)}), got shape {a.shape}"
            )
        bad = ~np.isfinite(a)
        if bad.any():
            bad_names = [names[int(i)] for i in np.flatnonzero(bad)]
            raise ValueError(
                f"{self.env_id} got a NaN or infinite muscle excitation for "
                f"{', '.join(bad_names)}; excitations must be finite numbers in [0, 1]"
            )
        return a
