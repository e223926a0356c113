"""Env stepping: a vector env stepped with an agent's exploratory actions, the episodes it
finishes and their metrics. The same code runs in this process (serial runs) and in a farm's
remote actors (``harness.runtime.farm``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from harness.api import Transition, team_reward, tree_map
from harness.errors import ConfigError

Episode = tuple[float, int, dict[str, float]]
"""A finished episode: its return, its length and the env's episode metrics (see
:func:`episode_metrics`)."""

EPISODE_METRICS = "episode_metrics"
"""Info key of an env's per-episode metrics: a dict of floats (e.g. a competition's official
score beside the shaped return) in the info of the step that ends the episode. The runner
reports their means as ``charts/NAME`` and ``eval/NAME``."""

STEP_FIELDS: tuple[str, ...] = tuple(name for name in Transition._fields if name != "extras")
"""The array fields of a :class:`~harness.api.Transition` in its order (``obs`` ...
``truncated``), without ``extras``: what a rollout chunk holds by name, so the stepper that
writes chunks and the farm that turns them back into transitions name the same fields."""


class Acting(Protocol):
    """What the stepper needs of whoever chooses the actions: an :class:`~harness.api.Agent`,
    or a farm actor's stand-in that asks a central policy server
    (:class:`harness.runtime.inference.CentralActing`)."""

    def sample(self, obs: Any) -> tuple[Any, Mapping[str, np.ndarray]]: ...

    def episodes_ended(self, mask: np.ndarray) -> None: ...


def episode_metrics(infos: Mapping[str, Any], i: int) -> dict[str, float]:
    """Env ``i``'s :data:`EPISODE_METRICS` from a vector step's infos in which it ended
    (gymnasium's SAME_STEP autoreset keeps the final step's info in ``infos["final_info"]``,
    merged per key with ``_key`` masks)."""
    final = infos.get("final_info")
    if not final:
        return {}
    found = final.get(EPISODE_METRICS)
    mask = final.get("_" + EPISODE_METRICS)
    if not found or mask is None or not mask[i]:
        return {}
    return {
        name: float(values[i])
        for name, values in found.items()
        if not name.startswith("_") and found.get("_" + name, mask)[i]
    }


def configure_envs(envs: Any, changes: Mapping[str, Any]) -> None:
    """``configure(**changes)`` on every env of a vector env (see ``Run.update_env``)."""
    try:
        envs.call("configure", **changes)
    except AttributeError:
        raise ConfigError(
            f"the env does not support changing options during a run (no configure method); "
            f"cannot apply {dict(changes)}."
        ) from None


class EnvStepper:
    """Steps a vector env with an agent's exploratory actions and keeps the episode
    statistics; the same code runs in this process (serial runs) and in remote actors."""

    def __init__(self, envs: Any, seed: int) -> None:
        self.envs = envs
        self.n = envs.num_envs
        self.obs, _ = envs.reset(seed=seed)
        self.ep_return = np.zeros(self.n)  # a multi-agent env's: the team's (sum over agents)
        self.ep_length = np.zeros(self.n, dtype=np.int64)

    def step(self, agent: Acting, finished: list[Episode]) -> Transition:
        """One vector step; appends (return, length, metrics) of episodes that ended to
        ``finished``.
        The transition's ``next_obs`` holds the true final observation of ended episodes."""
        obs = self.obs
        actions, extras = agent.sample(obs)
        next_obs, rewards, terminated, truncated, infos = self.envs.step(actions)
        real_next = next_obs
        self.ep_return += team_reward(rewards)
        self.ep_length += 1
        # SAME_STEP autoreset: "_final_obs" is in the infos exactly when an episode ended
        # (harness.testing.check_env holds every env plugin to it)
        final_mask = infos.get("_final_obs")
        if final_mask is not None:
            real_next = tree_map(np.copy, next_obs)
            _put_final_obs(real_next, infos, final_mask)
            done = terminated | truncated
            for i in np.flatnonzero(done):
                finished.append(
                    (
                        float(self.ep_return[i]),
                        int(self.ep_length[i]),
                        episode_metrics(infos, int(i)),
                    )
                )
                self.ep_return[i] = 0.0
                self.ep_length[i] = 0
            agent.episodes_ended(done)
        self.obs = next_obs
        return Transition(obs, actions, rewards, real_next, terminated, truncated, extras)

    def rollout(self, agent: Acting, steps: int, finished: list[Episode]) -> dict[str, Any]:
        """``steps`` vector steps written into time-major arrays ``(steps, n, ...)``: the
        :data:`STEP_FIELDS` by name plus ``extras`` (a dict). What :meth:`step` gives step by
        step, for a remote actor: no per-step objects, the episode statistics done once at
        the end (``finished`` gets them in time order, like ``step``)."""
        bufs: dict[str, np.ndarray] = {}
        extra_bufs: dict[str, np.ndarray] = {}
        any_done = False
        ended: dict[tuple[int, int], dict[str, float]] = {}  # (t, env): episode metrics
        for t in range(steps):
            obs = self.obs
            actions, extras = agent.sample(obs)
            next_obs, rewards, terminated, truncated, infos = self.envs.step(actions)
            values = (obs, actions, rewards, next_obs, terminated, truncated)  # STEP_FIELDS
            if t == 0:
                for name, value in zip(STEP_FIELDS, values, strict=True):
                    bufs[name] = tree_map(_time_major(steps), value)
                for key, value in extras.items():
                    extra_bufs[key] = _time_major(steps)(value)
            for name, value in zip(STEP_FIELDS, values, strict=True):
                tree_map(_setter(t), bufs[name], value)
            for key, value in extras.items():
                extra_bufs[key][t] = value
            final_mask = infos.get("_final_obs")  # SAME_STEP autoreset, as in step()
            if final_mask is not None:
                any_done = True
                _put_final_obs(tree_map(_getter(t), bufs["next_obs"]), infos, final_mask)
                for i in np.flatnonzero(final_mask):
                    metrics = episode_metrics(infos, int(i))
                    if metrics:
                        ended[t, int(i)] = metrics
                agent.episodes_ended(terminated | truncated)
            self.obs = next_obs
        done = bufs["terminated"] | bufs["truncated"]
        self._account(team_reward(bufs["rewards"]), done, any_done, finished, ended)
        chunk: dict[str, Any] = dict(bufs)
        chunk["extras"] = extra_bufs
        return chunk

    def _account(
        self,
        rewards: np.ndarray,
        done: np.ndarray,
        any_done: bool,
        finished: list[Episode],
        ended: Mapping[tuple[int, int], dict[str, float]],
    ) -> None:
        """Episode statistics of ``(T, n)`` rewards and done flags (see :meth:`rollout`)."""
        steps = len(rewards)
        if not any_done:
            self.ep_return += rewards.sum(axis=0)
            self.ep_length += steps
            return
        cum = np.cumsum(rewards, axis=0)
        last = np.full(self.n, -1)  # the step of each env's latest episode end
        for t, i in np.argwhere(done):
            before = cum[last[i], i] if last[i] >= 0 else 0.0
            ep_return = self.ep_return[i] + cum[t, i] - before
            length = int(self.ep_length[i] + t - last[i])
            finished.append((float(ep_return), length, ended.get((int(t), int(i)), {})))
            self.ep_return[i] = 0.0
            self.ep_length[i] = 0
            last[i] = t
        cols = np.arange(self.n)
        self.ep_return += cum[-1] - np.where(last >= 0, cum[last, cols], 0.0)
        self.ep_length += steps - 1 - last


def _time_major(steps: int) -> Callable[[Any], np.ndarray]:
    def empty(value: Any) -> np.ndarray:
        value = np.asarray(value)
        return np.empty((steps, *value.shape), value.dtype)

    return empty


def _setter(t: int) -> Callable[[np.ndarray, Any], None]:
    def put(buf: np.ndarray, value: Any) -> None:
        buf[t] = value

    return put


def _getter(t: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda buf: buf[t]  # a view: writing into it writes the buffer


def _put_final_obs(next_obs: Any, infos: Mapping[str, Any], mask: np.ndarray) -> None:
    """Write the true final observations of the envs in ``mask`` into ``next_obs`` (in place):
    gymnasium keeps one per env in ``infos["final_obs"]``; a multi-agent env an agent-keyed
    dict of arrays shaped like its observations (rows outside ``mask`` unused)."""
    final = infos["final_obs"]
    rows = np.flatnonzero(mask)
    if isinstance(next_obs, Mapping):
        for agent, value in next_obs.items():
            value[rows] = final[agent][rows]
        return
    for i in rows:
        next_obs[i] = final[i]
