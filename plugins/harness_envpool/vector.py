"""An EnvPool pool as the vector env harness's runner drives: gymnasium's vector API with
SAME_STEP autoreset, seeded by ``reset(seed=...)``, the real game score as an episode metric.

**Autoreset.** EnvPool resets an env on the step *after* the one that ended its episode
(gymnasium's NEXT_STEP): that step ignores the env's action and returns the first observation
of the next episode. harness needs SAME_STEP (the ending step returns the reset observation,
the true final one in ``infos["final_obs"]``). :meth:`EnvPoolVectorEnv.step` therefore does
that next step at once, for the envs that ended only: a second ``send`` of placeholder actions
with ``env_id`` = those envs, then ``recv``. In EnvPool's sync mode (``batch_size ==
num_envs``) a ``recv`` after a partial ``send`` waits for exactly the envs sent
(``AsyncEnvPool::Recv`` counts the missing ones as done), so this costs one round trip
through the thread pool for a handful of envs, only on steps where an episode ended (Pong,
8 envs: about one step in 110).

It is a plain step, not ``reset(env_id)``: EnvPool's reset is a *forced* reset, which restarts
the game even under episodic life, whereas a step of an ended env runs EnvPool's own reset
rule (a lost life continues the game; a game over, a time limit or a first reset restarts
it), exactly what the env does when left to itself.

**Seeding.** EnvPool seeds its envs when the pool is built (env ``i`` from ``seed + i``) and
ignores ``reset(seed=...)``. Here the pool is built at the first ``reset`` and rebuilt at every
``reset(seed=s)``, so a seeded reset starts the same trajectories whatever ran before (what
``harness.testing.check_env`` checks). Building a pool loads each env (an Atari ROM, a MuJoCo
model): 50-100 ms per env here, paid once per run.

**Episode metrics (Atari).** With episodic life and clipped rewards the agent's return is per
life and clipped. The step that ends a *game* (game over or time limit) reports
``game_score``, the game's unclipped score summed over all its lives, in
``info["episode_metrics"]`` (logged as ``charts/game_score`` and ``eval/game_score``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

INT32_SEEDS = 2**31
"""EnvPool takes int32 seeds (its ``_assert_int32_seed``); larger ones are folded into range."""


class EnvPoolVectorEnv(VectorEnv):
    """``num_envs`` envs of the EnvPool task ``task_id``, made with ``make_kwargs`` (EnvPool's
    own config keys); see the module docstring."""

    def __init__(
        self,
        envpool: Any,
        task_id: str,
        num_envs: int,
        make_kwargs: dict[str, Any],
        *,
        seed: int | None = None,
    ) -> None:
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}
        self._envpool = envpool
        self.task_id = task_id
        self.num_envs = num_envs
        self._make_kwargs = dict(make_kwargs)
        spec = envpool.make_spec(task_id, num_envs=num_envs, **self._make_kwargs)
        self.config: dict[str, Any] = dict(spec.config._asdict())
        """The task's full EnvPool config (defaults included)."""
        self.single_observation_space = spec.gymnasium_observation_space
        self.single_action_space = spec.gymnasium_action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.atari = "episodic_life" in self.config
        self._seed = 0 if seed is None else seed
        self._pool: Any = None
        self._score = np.zeros(num_envs, np.float64)  # the running game's unclipped score
        shape = self.single_action_space.shape or ()
        dtype = self.single_action_space.dtype
        self._noop = np.zeros((num_envs, *shape), dtype)  # placeholders (ignored: see step)

    # -- gymnasium -----------------------------------------------------------------------
    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """All envs start a new episode (a new game: a forced reset). With ``seed`` (or at
        the first reset) the pool is built anew, seeded from it."""
        if options:
            raise ValueError(
                f"{self.task_id}: reset options {sorted(options)} are not supported (EnvPool "
                f"resets every env)"
            )
        if isinstance(seed, list):
            raise ValueError("reset(seed=...) takes one int: env i is seeded with seed + i")
        if seed is not None or self._pool is None:
            self._build(self._seed if seed is None else seed)
            # (a new pool's envs are fresh; its reset() is their first episode's start)
        obs, _ = self._pool.reset()
        self._score[:] = 0.0
        return obs, {}

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self._pool is None:
            raise RuntimeError(f"{self.task_id}: call reset() before step()")
        obs, rewards, terminated, truncated, info = self._pool.step(np.asarray(actions))
        rewards = rewards.astype(np.float64)  # (EnvPool gives float32; gymnasium float64)
        terminated = np.asarray(terminated, np.bool_)
        truncated = np.asarray(truncated, np.bool_)
        done = terminated | truncated
        infos: dict[str, Any] = {}
        game_over = None
        if self.atari:
            self._score += info["reward"]  # (unclipped)
            game_over = done & (np.asarray(info["terminated"], np.bool_) | truncated)
        if done.any():
            if not obs.flags.writeable:
                obs = obs.copy()
            infos["final_obs"] = obs.copy()  # (rows of envs that did not end: unused)
            infos["_final_obs"] = done.copy()
            ended = np.flatnonzero(done).astype(np.int32)
            self._pool.send(self._noop[: len(ended)], ended)
            first, *_, reset_info = self._pool.recv()
            obs[np.asarray(reset_info["env_id"])] = first
            if game_over is not None and game_over.any():
                infos["final_info"] = {
                    "episode_metrics": {
                        "game_score": np.where(game_over, self._score, 0.0),
                        "_game_score": game_over,
                    },
                    "_episode_metrics": game_over,
                }
                self._score[game_over] = 0.0
        return obs, rewards, terminated, truncated, infos

    def close(self, **kwargs: Any) -> None:
        """Stop the pool's threads (EnvPool joins them when the pool is freed)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- internals -----------------------------------------------------------------------
    def _build(self, seed: int) -> None:
        self.close()
        self._seed = int(seed) % (INT32_SEEDS - self.num_envs)
        self._pool = self._envpool.make_gymnasium(
            self.task_id, num_envs=self.num_envs, seed=self._seed, **self._make_kwargs
        )

    def __repr__(self) -> str:
        return f"EnvPoolVectorEnv({self.task_id!r}, num_envs={self.num_envs})"
