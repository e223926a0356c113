"""Env stepping: a vector env stepped with a policy's exploratory actions, the episodes it
finishes and their metrics. The same code runs in this process (serial runs) and in a farm's
remote actors (``harness.runtime.farm``). The stepper acts through a
:class:`harness.policy.Policy` and owns its per-env state: it resets the rows of the envs whose
episodes ended."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.api import Transition, team_reward, tree_map
from harness.errors import ConfigError, HarnessError, PluginError
from harness.policy import ActingHooks, Policy, State, as_policy

if TYPE_CHECKING:
    from harness.registry import Registry

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


class EnvFault(PluginError):
    """An env failed while a run stepped it (it raised, or broke its own contract, e.g. an
    observation whose shape changed): the message names the env id, its family's plugin,
    the env step and what was expected. The run ends with its last good checkpoint and a
    summary (exit 2)."""


def env_label(env_id: str, registry: Registry) -> str:
    """``env 'ID' (env family 'F' of plugin 'P')``: who an env fault is about."""
    spec = registry.env_for(env_id)
    return f"env {env_id!r} (env family {spec.name!r} of plugin {spec.plugin or '?'!r})"


def _shapes(obs: Any) -> tuple[int, ...] | None:
    """The shape of an observation batch; None for anything but an array (a multi-agent env's
    agent-keyed dict, whose agents may come and go: not checked)."""
    return obs.shape if isinstance(obs, np.ndarray) else None


def env_call(
    call: Callable[[], Any],
    label: str,
    what: str,
    env_steps: int,
    shape: tuple[int, ...] | None = None,
) -> Any:
    """``call()`` (an env's reset or step), with whatever it raises (bad input excepted)
    turned into an :class:`EnvFault` naming the env (``label``: :func:`env_label`), ``what``
    it was doing and the env step; ``shape``: the observation batch's at reset."""
    try:
        return call()
    except HarnessError:
        raise
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}".strip().rstrip(".")
        expected = (
            "a reset returning (obs, infos)"
            if what == "reset"
            else "a step returning (obs, rewards, terminated, truncated, infos)"
        )
        if isinstance(exc, ValueError) and "shape" in str(exc) and shape is not None:
            # (a vector env that stacks its envs' observations fails like this when one
            # env's observation changed shape)
            expected = f"observations shaped {shape} as at reset (one of its envs probably "
            expected += "returned an observation of another shape)"
        raise EnvFault(
            f"{label[0].upper()}{label[1:]} failed in {what} at env step {env_steps}: "
            f"{detail}. Expected {expected}. Fix the env plugin (its conformance check: "
            "harness.testing.check_env with a longer steps=...), then resume from the last "
            "checkpoint."
        ) from exc


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

    def __init__(self, envs: Any, seed: int, *, label: str = "the env", env_steps: int = 0) -> None:
        self.envs = envs
        self.n = envs.num_envs
        self.label = label
        """Who a fault is about (:func:`env_label`)."""
        self.env_steps = env_steps
        """Env steps taken (from the run's step where the owner knows it): a fault's step."""
        self.obs, _ = self._call("reset", lambda: envs.reset(seed=seed))
        self.shapes = _shapes(self.obs)
        """The observation batch's shape at reset (None: not an array): every step keeps it."""
        self.ep_return = np.zeros(self.n)  # a multi-agent env's: the team's (sum over agents)
        self.ep_length = np.zeros(self.n, dtype=np.int64)
        self._actor: object = None
        self._policy: Policy | None = None
        self.state: State = {}
        """The policy's per-env state (:data:`harness.policy.State`), one row per env."""

    def policy_of(self, actor: Policy | ActingHooks) -> Policy:
        """The policy ``actor`` acts through (an agent's ``policy()``, a policy, or old
        hooks wrapped), made once per actor; a new actor's envs start from its initial
        state."""
        if actor is not self._actor or self._policy is None:
            self._actor, self._policy = actor, as_policy(actor)
            self.state = self._policy.initial_state(self.n)
        return self._policy

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        return env_call(call, self.label, what, self.env_steps, getattr(self, "shapes", None))

    def _checked(self, next_obs: Any) -> None:
        """An observation batch whose shapes changed since reset is a fault (a vector env
        that does not stack its envs' observations would pass it on to the agent)."""
        shapes = _shapes(next_obs)
        if shapes != self.shapes:
            raise EnvFault(
                f"{self.label[0].upper()}{self.label[1:]} returned observations shaped "
                f"{shapes} at env step {self.env_steps}, where reset gave {self.shapes}: an "
                "env's observation must keep its observation space's shape all run. Fix the "
                "env plugin, then resume from the last checkpoint."
            )

    def _step(self, actions: Any) -> Any:
        result = self._call("step", lambda: self.envs.step(actions))
        self._checked(result[0])
        self.env_steps += self.n
        return result

    def step(self, actor: Policy | ActingHooks, finished: list[Episode]) -> Transition:
        """One vector step with ``actor``'s exploratory actions (:meth:`policy_of`), as a
        :class:`~harness.api.Transition`: a one-step :meth:`rollout` (one path, one set of
        episode rules); appends (return, length, metrics) of episodes that ended to
        ``finished``. The transition's ``next_obs`` holds the true final observation of ended
        episodes."""
        return next(chunk_transitions([self.rollout(actor, 1, finished)]))

    def rollout(
        self, actor: Policy | ActingHooks, steps: int, finished: list[Episode]
    ) -> dict[str, Any]:
        """``steps`` vector steps written into time-major arrays ``(steps, n, ...)``: the
        :data:`STEP_FIELDS` by name plus ``extras`` (a dict); :func:`chunk_transitions` gives
        them back step by step. The one way envs are stepped for training, in this process
        (serial runs) and in every farm actor, so exploration schedules read the learner's
        counters once per rollout in both (they move between rollouts). No per-step objects;
        the episode statistics are done once at the end (``finished`` gets them in time
        order)."""
        bufs: dict[str, np.ndarray] = {}
        extra_bufs: dict[str, np.ndarray] = {}
        any_done = False
        ended: dict[tuple[int, int], dict[str, float]] = {}  # (t, env): episode metrics
        policy = self.policy_of(actor)
        for t in range(steps):
            obs = self.obs
            actions, extras, self.state = policy.act(obs, self.state, explore=True)
            next_obs, rewards, terminated, truncated, infos = self._step(actions)
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
                self.state = policy.reset(self.state, terminated | truncated, explore=True)
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


def chunk_transitions(chunks: Sequence[Mapping[str, Any]]) -> Iterator[Transition]:
    """The transitions of rollout chunks (:meth:`EnvStepper.rollout`'s, equally many steps),
    step by step, their envs side by side in chunk order. Each step's arrays are joined on
    their own: joining whole chunks first would allocate rollout-sized arrays (tens of MB of
    Atari frames) that the allocator maps fresh every iteration, page faults included
    (measured 106 vs 13 ms for two 32-env chunks). One chunk's arrays are views of it."""
    extras_keys = list(chunks[0]["extras"])
    for t in range(len(chunks[0]["terminated"])):

        def side_by_side(*parts: np.ndarray, t: int = t) -> np.ndarray:
            if len(parts) == 1:
                return np.asarray(parts[0][t])
            return np.concatenate([part[t] for part in parts])

        fields = [
            tree_map(side_by_side, chunks[0][name], *(c[name] for c in chunks[1:]))
            for name in STEP_FIELDS
        ]
        extras = {key: side_by_side(*(c["extras"][key] for c in chunks)) for key in extras_keys}
        yield Transition(*fields, extras)  # type: ignore[call-arg]


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
