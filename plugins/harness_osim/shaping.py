"""Reward shapings of the competition packs, each one the published winning recipe.

A shaping turns one simulator step into the reward the learner sees; the official reward of
the step is always kept beside it (the pack reports the official score separately). Shapings
are chosen by name (``[env] shaping``) with coefficients in ``[env] shaping_coef``; unknown
names or coefficients are refused at start-up with the valid ones listed.

Prosthetics (NeurIPS 2018, team Firework / PARL, examples/NeurIPS2018-AI-for-Prosthetics-
Challenge, env_wrapper.py and args.py):

- ``fixed_speed`` (their curriculum stages "run at 3.0 / 2.0 / 1.25 m/s"):
  ``36 - vel_coef * ((v_x - target_speed)^2 + v_z^2) - act_coef * max(act_lb, |a|_2)``
  (PARL's defaults: vel_coef 1, act_coef 5; act_lb 1.5 / 0.75 / 0.6 for 3.0 / 2.0 / 1.25 m/s).
- ``round2`` (their final stage): ``10 - vel_coef * |v_tgt - v|^2 - 0.001 * sum(activation^2)``
  and, except during the first ``grace`` steps of the episode and after each change of the
  target velocity, ``- act_coef * max(act_lb, |a|_2)`` (vel_coef 20, act_coef 7, act_lb 0.75,
  grace 60).

Learn to Move (NeurIPS 2019, PARL, examples/NeurIPS2019-Learn-to-Move-Challenge):

- ``velocity_effort``: ``10 - penalty_coef * (vel_coef * |v_tgt(pelvis) - v|_2 +
  muscle_coef * sum(activation^2))``; the stage coefficients of their curriculum are
  penalty_coef 3 (difficulty 1), 5 (difficulty 2), 3 with vel_coef 3 (difficulty 3, first
  target) and 2 with vel_coef 3 (difficulty 3).

``official`` (both) is the competition reward unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from harness.errors import ConfigError


class Shaping:
    """Base: ``reset(env)`` at each episode start, ``__call__(env, official, action)`` per
    simulator step (after it), returning the shaped reward."""

    defaults: ClassVar[Mapping[str, float]] = {}

    def __init__(self, coef: Mapping[str, float]) -> None:
        unknown = sorted(set(coef) - set(self.defaults))
        if unknown:
            raise ConfigError(
                f"[env] shaping_coef: {', '.join(map(repr, unknown))} is not a coefficient of "
                f"shaping {self.name!r} (its coefficients: "
                f"{', '.join(f'{k} = {v}' for k, v in self.defaults.items()) or 'none'})."
            )
        self.c = {**self.defaults, **{k: float(v) for k, v in coef.items()}}

    name = "official"

    def reset(self, env: Any) -> None:
        pass

    def __call__(self, env: Any, official: float, action: np.ndarray) -> float:
        return official


def _pelvis_velocity(env: Any) -> np.ndarray:
    v = env.state_desc()["body_vel"]["pelvis"]
    return np.array([v[0], v[2]])


def _activation_cost(env: Any) -> float:
    return float(np.sum(np.square(env.activations())))


class FixedSpeed(Shaping):
    name = "fixed_speed"
    defaults: ClassVar[Mapping[str, float]] = {
        "target_speed": 3.0,
        "vel_coef": 1.0,
        "act_coef": 5.0,
        "act_lb": 1.5,
    }

    def __call__(self, env: Any, official: float, action: np.ndarray) -> float:
        c = self.c
        v = _pelvis_velocity(env)
        vel_penalty = (v[0] - c["target_speed"]) ** 2 + v[1] ** 2
        act = max(c["act_lb"], float(np.linalg.norm(action)))
        return float(36.0 - c["vel_coef"] * vel_penalty - c["act_coef"] * act)


class Round2(Shaping):
    name = "round2"
    defaults: ClassVar[Mapping[str, float]] = {
        "vel_coef": 20.0,
        "act_coef": 7.0,
        "act_lb": 0.75,
        "grace": 60.0,
    }

    def reset(self, env: Any) -> None:
        self.steps = 0
        self.changed_at = 0
        self.last_target: np.ndarray | None = None

    def __call__(self, env: Any, official: float, action: np.ndarray) -> float:
        c = self.c
        self.steps += 1
        target = np.asarray(env.target_velocity(), dtype=float)
        if self.last_target is not None and np.any(np.abs(target - self.last_target) > 1e-5):
            self.changed_at = self.steps
        self.last_target = target
        v = _pelvis_velocity(env)
        r = 10.0 - c["vel_coef"] * ((target[0] - v[0]) ** 2 + (target[2] - v[1]) ** 2)
        if self.steps >= c["grace"] and self.steps - self.changed_at >= c["grace"]:
            r -= c["act_coef"] * max(c["act_lb"], float(np.linalg.norm(action)))
        return float(r - 0.001 * _activation_cost(env))


class VelocityEffort(Shaping):
    name = "velocity_effort"
    defaults: ClassVar[Mapping[str, float]] = {
        "vel_coef": 1.0,
        "muscle_coef": 1.0,
        "penalty_coef": 1.0,
    }

    def __call__(self, env: Any, official: float, action: np.ndarray) -> float:
        c = self.c
        target = np.asarray(env.target_velocity(), dtype=float)
        v = _pelvis_velocity(env)
        # the norm of the difference is the same in the ground frame as in PARL's body frame
        vel_penalty = float(np.hypot(target[0] - v[0], target[2] - v[1]))
        effort = _activation_cost(env)
        return 10.0 - c["penalty_coef"] * (c["vel_coef"] * vel_penalty + c["muscle_coef"] * effort)


SHAPINGS: dict[str, dict[str, type[Shaping]]] = {
    "prosthetics": {"official": Shaping, "fixed_speed": FixedSpeed, "round2": Round2},
    "l2m": {"official": Shaping, "velocity_effort": VelocityEffort},
}


def make_shaping(family: str, name: str, coef: Mapping[str, float]) -> Shaping:
    """The shaping ``name`` of env family ``family`` (``prosthetics`` or ``l2m``)."""
    table = SHAPINGS[family]
    if name not in table:
        raise ConfigError(
            f"[env] shaping = {name!r} is not a shaping of {family} (choose one of: "
            f"{', '.join(table)})."
        )
    return table[name](coef)
