"""The episode metrics of a MyoSuite env: :class:`MyoEpisodeWrapper`.

MyoSuite reports, at every step, its reward terms and a ``solved`` flag in the step's info,
beside the whole observation and reward dicts (``obs_dict``, ``rwd_dict``). harness needs none of
that per step, only a summary of each episode: on the step that ends an episode the wrapper's
info is ``{"episode_metrics": {...}}`` (what the runner logs as ``charts/NAME`` and
``eval/NAME``), and on every other step it is empty. Dropping the per-step info is also what
keeps the vector env as fast as a raw MyoSuite loop: merging MyoSuite's nested info dicts into
the batch's infos costs every step (measured, one env, random actions: raw loop 1080 steps/s,
this wrapper in harness's vector env 1112, the vector env keeping MyoSuite's infos 940 on Die
Reorient; 834 / 812 / 772 on OslRunFixed).

The metrics, where the env reports ``solved`` (every MyoChallenge task does):

* ``solved_fraction``: the fraction of the episode's steps on which it was solved;
* ``solved_final``: 1 if it was solved on the last step;
* ``success``: 1 if it was solved on more than ``success_steps`` steps (MyoSuite's own
  ``evaluate_success`` rule, 5 steps by default);

and for every env ``terminated`` (1 if the env ended the episode: a die dropped, a fall; 0 at
the time limit), plus the episode mean of each info entry named in ``metric_keys``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from harness.errors import ConfigError

EPISODE_METRICS = "episode_metrics"
"""The info key harness's runner reads an episode's metrics from (on the ending step)."""

_PLAIN = (bool, int, float)


def scalar(value: Any) -> float:
    """A MyoSuite info entry as a float: Python and NumPy scalars, and the (1, 1) arrays some
    tasks report (Bimanual's ``solved``), by their mean."""
    if type(value) in _PLAIN:
        return float(value)
    return float(np.mean(value))


class MyoEpisodeWrapper(gym.Wrapper[Any, Any, Any, Any], gym.utils.RecordConstructorArgs):
    """Per-step info of a MyoSuite env in, episode metrics out (see the module docstring).
    It records its arguments so that ``env.spec`` can rebuild it (gymnasium's ``check_env``
    does)."""

    def __init__(
        self, env: Any, *, success_steps: int = 5, metric_keys: tuple[str, ...] = ()
    ) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self, success_steps=success_steps, metric_keys=metric_keys
        )
        gym.Wrapper.__init__(self, env)
        self.success_steps = success_steps
        self.metric_keys = metric_keys
        self._checked = False
        self._reset_counts()

    def _reset_counts(self) -> None:
        self._steps = 0
        self._solved_steps = 0
        self._solved = False
        self._has_solved = False
        self._sums = dict.fromkeys(self.metric_keys, 0.0)

    def reset(self, **kwargs: Any) -> Any:
        self._reset_counts()
        obs, _ = self.env.reset(**kwargs)
        return obs, {}

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if not self._checked:
            self._check_keys(info)
        self._steps += 1
        solved = info.get("solved")
        if solved is not None:
            self._has_solved = True
            self._solved = scalar(solved) != 0.0
            self._solved_steps += self._solved
        for key in self.metric_keys:
            self._sums[key] += scalar(info[key])
        if not (terminated or truncated):
            return obs, reward, terminated, truncated, {}
        return obs, reward, terminated, truncated, {EPISODE_METRICS: self._metrics(terminated)}

    def _metrics(self, terminated: bool) -> dict[str, float]:
        n = self._steps
        metrics = {"terminated": float(terminated)}
        if self._has_solved:
            metrics["solved_fraction"] = self._solved_steps / n
            metrics["solved_final"] = float(self._solved)
            metrics["success"] = float(self._solved_steps > self.success_steps)
        metrics.update({key: total / n for key, total in self._sums.items()})
        return metrics

    def _check_keys(self, info: dict[str, Any]) -> None:
        """``metric_keys`` must name scalar entries of the env's info (checked at the first
        step: MyoSuite's info keys are only known then)."""
        self._checked = True
        env_id = self.env.spec.id if self.env.spec is not None else type(self.env.unwrapped)
        scalars = sorted(k for k, v in info.items() if k not in ("obs_dict", "rwd_dict"))
        for key in self.metric_keys:
            try:
                scalar(info[key])
            except (KeyError, TypeError, ValueError):
                raise ConfigError(
                    f"[env] metric_keys names {key!r}, which is not a number in {env_id}'s step "
                    f"info; its entries: {', '.join(scalars)}."
                ) from None
