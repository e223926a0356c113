"""N copies of a PettingZoo env (parallel or AEC) as one multi-agent vector env.

This is the sampling hot path of every multi-agent run (serial runs and each farm actor), so
the adapter drives the PettingZoo envs directly instead of stacking wrappers: one pass over the
copies per vector step, writing each agent's observation and reward straight into fresh batch
arrays (the caller may keep them), with the per-agent bookkeeping (which agents are still in
the episode, their returns) in small per-copy structures.

Semantics (the multi-agent vector env protocol of docs/multiagent.md):

- ``agents`` is the first copy's ``possible_agents``, in that order; every observation, action
  and reward dict has exactly those keys, each an array with the copies on the first axis.
- An episode ends for all its agents at once, when no agent is left in it. An agent that
  leaves earlier gets zero observations and zero rewards until then, and its actions are
  ignored ("black death"); an agent that has not joined yet is treated the same way. The step
  in which an agent leaves still returns its real (final) observation and reward.
- ``terminated`` / ``truncated`` are per copy: ``truncated`` when any agent leaving at the end
  was truncated, else ``terminated``.
- SAME_STEP autoreset: a copy whose episode ended is reset in the same step; its rows hold the
  reset observation and ``infos["final_obs"]`` (with the ``infos["_final_obs"]`` mask) the
  final ones. Each agent's own episode return is reported as the episode metric
  ``return/<agent>`` (``infos["final_info"]["episode_metrics"]``, gymnasium's merged format).
- ``reset(seed=s)`` seeds copy ``i`` with ``s + i``; later episodes continue each copy's own
  generator, so a run is reproducible from its seed.
- Box observations with a floating dtype come out as float32 (the declared spaces say so);
  integer ones (image frames) keep their dtype. Per-agent infos are not forwarded.

AEC envs are stepped one cycle per vector step: every live agent acts once, in the env's own
``agent_selection`` order, with its action from the dict; agents that are done are stepped with
``None`` as PettingZoo requires; the rewards every step hands out (``env.rewards``) are summed
per agent over the cycle, so each reward counts once, as ``env.last()`` would report it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from harness.errors import IncompatibleError

EPISODE_METRICS = "episode_metrics"  # harness.runtime.stepper.EPISODE_METRICS (no runtime import)


def check_space(agent: str, space: Any, what: str, env_name: str) -> None:
    """Refuse spaces harness algorithms cannot take, naming the agent and a fix."""
    if isinstance(space, spaces.Discrete | spaces.Box):
        return
    raise IncompatibleError(
        f"{env_name}: the {what} space of agent {agent!r} is {space}; harness multi-agent envs "
        f"take Box or Discrete spaces only. Wrap the env so that it has one (e.g. SuperSuit's "
        f"flatten / dtype wrappers, or your own pettingzoo.utils.BaseParallelWrapper) and use "
        f"the id 'pettingzoo:your.module:factory' for the wrapped env."
    )


def _batch_space(space: Any) -> Any:
    """The observation space as the adapter delivers it (floating Box -> float32)."""
    floating = isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating)
    if floating and space.dtype != np.float32:
        return spaces.Box(
            low=space.low.astype(np.float32),
            high=space.high.astype(np.float32),
            shape=space.shape,
            dtype=np.float32,
        )
    return space


class _Copy:
    """One env copy and what the adapter tracks about its current episode."""

    __slots__ = ("env", "gone", "live")

    def __init__(self, env: Any) -> None:
        self.env = env
        self.live: list[str] = []
        """Agents in the episode that have not left (black death for every other one)."""
        self.gone: set[str] = set()
        """AEC: agents that left the episode (and were reported) before this cycle."""


class MultiAgentVectorEnv:
    """``num_envs`` PettingZoo envs built by ``make_one`` as a multi-agent vector env (see the
    module docstring). ``aec`` says which API ``make_one``'s envs have."""

    def __init__(
        self,
        make_one: Callable[[], Any],
        num_envs: int,
        *,
        aec: bool,
        name: str = "env",
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = num_envs
        self.aec = aec
        self.name = name
        envs = [make_one()]
        try:
            first = envs[0]
            self.agents: tuple[str, ...] = tuple(first.possible_agents)
            if not self.agents:
                raise IncompatibleError(f"{name} has no possible_agents.")
            for agent in self.agents:
                check_space(agent, first.observation_space(agent), "observation", name)
                check_space(agent, first.action_space(agent), "action", name)
            envs += [make_one() for _ in range(num_envs - 1)]
        except BaseException:
            for env in envs:
                env.close()
            raise
        self.single_observation_spaces: dict[str, Any] = {
            a: _batch_space(first.observation_space(a)) for a in self.agents
        }
        self.single_action_spaces: dict[str, Any] = {a: first.action_space(a) for a in self.agents}
        self.single_observation_space = self.single_observation_spaces[self.agents[0]]
        self.single_action_space = self.single_action_spaces[self.agents[0]]
        self._column = {a: j for j, a in enumerate(self.agents)}
        self._obs_shape = {
            a: (num_envs, *s.shape) for a, s in self.single_observation_spaces.items()
        }
        self._obs_dtype = {a: s.dtype for a, s in self.single_observation_spaces.items()}
        self._act_dtype = {
            a: s.dtype if isinstance(s, spaces.Box) else None
            for a, s in self.single_action_spaces.items()
        }
        self._copies = [_Copy(env) for env in envs]
        self._returns = np.zeros((len(self.agents), num_envs))  # this episode's, per agent
        self._step_one = self._step_aec if aec else self._step_parallel
        self._closed = False

    # -- the protocol --------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        obs = self._empty_obs()
        for i, copy in enumerate(self._copies):
            self._reset_one(copy, i, obs, None if seed is None else seed + i, options)
        return obs, {}

    def step(
        self, actions: Mapping[str, Any]
    ) -> tuple[
        dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray, np.ndarray, dict[str, Any]
    ]:
        n = self.num_envs
        per_agent = self._action_rows(actions)
        obs = self._empty_obs()
        rewards = np.zeros((len(self.agents), n))
        terminated = np.zeros(n, np.bool_)
        truncated = np.zeros(n, np.bool_)
        ended: list[int] = []
        step_one = self._step_one
        for i, copy in enumerate(self._copies):
            done = step_one(copy, i, per_agent, obs, rewards)
            if done is not None:
                truncated[i] = done
                terminated[i] = not done
                ended.append(i)
        self._returns += rewards
        infos = self._autoreset(ended, obs) if ended else {}
        reward_dict = {a: rewards[j] for a, j in self._column.items()}
        return obs, reward_dict, terminated, truncated, infos

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for copy in self._copies:
            copy.env.close()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``getattr(env, name)(*args, **kwargs)`` on every copy (an attribute's value when it
        is not callable), like gymnasium's ``VectorEnv.call``."""
        results = []
        for copy in self._copies:
            attr = getattr(copy.env, name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        return tuple(results)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return tuple(getattr(copy.env, name) for copy in self._copies)

    @property
    def envs(self) -> list[Any]:
        """The PettingZoo envs themselves (for inspection and tests)."""
        return [copy.env for copy in self._copies]

    def __repr__(self) -> str:
        api = "aec" if self.aec else "parallel"
        return f"MultiAgentVectorEnv({self.name}, num_envs={self.num_envs}, api={api})"

    # -- internals ----------------------------------------------------------------------------

    def _empty_obs(self) -> dict[str, np.ndarray]:
        return {a: np.zeros(self._obs_shape[a], self._obs_dtype[a]) for a in self.agents}

    def _action_rows(self, actions: Mapping[str, Any]) -> dict[str, Sequence[Any]]:
        """Each agent's actions as one row per copy: Python ints for Discrete spaces (what
        every PettingZoo env takes), arrays of the space's dtype for Box spaces."""
        rows: dict[str, Sequence[Any]] = {}
        for agent in self.agents:
            try:
                batch = actions[agent]
            except KeyError:
                raise KeyError(
                    f"{self.name}: no actions for agent {agent!r}; step() takes a dict with "
                    f"every agent of {list(self.agents)} (rows of agents that left are ignored)"
                ) from None
            dtype = self._act_dtype[agent]
            if dtype is None:
                rows[agent] = np.asarray(batch).reshape(self.num_envs).tolist()
            else:
                rows[agent] = list(np.asarray(batch, dtype=dtype))
        return rows

    def _write_obs(self, obs: dict[str, np.ndarray], i: int, agent_obs: Mapping[str, Any]) -> None:
        for agent, value in agent_obs.items():
            obs[agent][i] = value

    def _reset_one(
        self,
        copy: _Copy,
        i: int,
        obs: dict[str, np.ndarray],
        seed: int | None,
        options: Mapping[str, Any] | None,
    ) -> None:
        env = copy.env
        self._returns[:, i] = 0.0
        copy.gone = set()
        if self.aec:
            env.reset(seed=seed, options=options)
            # agents that start the episode already done leave at once, with zero observations
            self._drain_dead(env)
            copy.live = list(env.agents)
            for agent in copy.live:
                obs[agent][i] = env.observe(agent)
        else:
            first, _ = env.reset(seed=seed, options=options)
            copy.live = [a for a in env.agents if a in first]
            self._write_obs(obs, i, first)

    @staticmethod
    def _drain_dead(env: Any) -> None:
        """Step the selected agent with None while it is done (PettingZoo's rule for dead
        agents: they leave ``env.agents`` that way)."""
        while env.agents:
            agent = env.agent_selection
            if not (env.terminations[agent] or env.truncations[agent]):
                return
            env.step(None)

    def _step_parallel(
        self,
        copy: _Copy,
        i: int,
        actions: Mapping[str, Sequence[Any]],
        obs: dict[str, np.ndarray],
        rewards: np.ndarray,
    ) -> bool | None:
        """Step a ParallelEnv copy; the episode's end (True: truncated, False: terminated) or
        None while it goes on."""
        env = copy.env
        agent_obs, agent_rewards, terms, truncs, _ = env.step(
            {agent: actions[agent][i] for agent in env.agents}
        )
        column = self._column
        for agent, value in agent_obs.items():
            obs[agent][i] = value
        for agent, reward in agent_rewards.items():
            rewards[column[agent], i] = reward
        live = [a for a in env.agents if not (terms.get(a, False) or truncs.get(a, False))]
        copy.live = live
        if live:
            return None
        return any(truncs.values())

    def _step_aec(
        self,
        copy: _Copy,
        i: int,
        actions: Mapping[str, Sequence[Any]],
        obs: dict[str, np.ndarray],
        rewards: np.ndarray,
    ) -> bool | None:
        """One cycle of an AECEnv copy (see the module docstring); returns like
        :meth:`_step_parallel`."""
        env = copy.env
        column = self._column
        acted: set[str] = set()
        gone = copy.gone
        left: dict[str, bool] = {}  # agents that left in this cycle -> truncated?
        terms, truncs = env.terminations, env.truncations
        while env.agents:
            agent = env.agent_selection
            if terms[agent] or truncs[agent]:
                if agent not in left and agent not in gone:
                    left[agent] = bool(truncs[agent])
                    obs[agent][i] = env.observe(agent)  # its final observation
                env.step(None)
            elif agent in acted:
                break  # every live agent has acted once: the cycle is complete
            else:
                env.step(actions[agent][i])
                acted.add(agent)
            terms, truncs, step_rewards = env.terminations, env.truncations, env.rewards
            for other in env.agents:
                reward = step_rewards[other]
                if reward:
                    rewards[column[other], i] += reward
        live = []
        for agent in env.agents:
            if terms[agent] or truncs[agent]:  # done, but not selected yet: it leaves now
                if agent not in left and agent not in gone:
                    left[agent] = bool(truncs[agent])
                    obs[agent][i] = env.observe(agent)
            else:
                live.append(agent)
                obs[agent][i] = env.observe(agent)
        gone.update(left)
        copy.live = live
        if live:
            return None
        if env.agents:  # every remaining agent is done: step them out before the reset
            self._drain_dead(env)
        return any(left.values())

    def _autoreset(self, ended: list[int], obs: dict[str, np.ndarray]) -> dict[str, Any]:
        """Final observations and per-agent returns of the copies in ``ended``, then their
        reset (SAME_STEP autoreset, gymnasium's merged info format)."""
        n = self.num_envs
        mask = np.zeros(n, np.bool_)
        mask[ended] = True
        final_obs = {a: np.zeros_like(x) for a, x in obs.items()}
        returns = np.zeros((len(self.agents), n))
        for i in ended:
            copy = self._copies[i]
            for agent, x in obs.items():
                final_obs[agent][i] = x[i]
                x[i] = 0
            returns[:, i] = self._returns[:, i]
            self._reset_one(copy, i, obs, None, None)
        metrics: dict[str, np.ndarray] = {}
        for agent, j in self._column.items():
            metrics[f"return/{agent}"] = returns[j]
            metrics[f"_return/{agent}"] = mask
        return {
            "final_obs": final_obs,
            "_final_obs": mask,
            "final_info": {EPISODE_METRICS: metrics, "_" + EPISODE_METRICS: mask},
            "_final_info": mask,
        }
