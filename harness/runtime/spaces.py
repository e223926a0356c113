"""Framework-neutral views of env spaces, read by duck typing (the core never imports
gymnasium): a space with ``n`` is discrete, one with ``low``/``high`` is a box."""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.api import EnvInfo, SpaceInfo
from harness.errors import IncompatibleError


def space_info(space: Any) -> SpaceInfo:
    if hasattr(space, "n") and not hasattr(space, "nvec"):
        if int(getattr(space, "start", 0)) != 0:
            raise IncompatibleError(
                f"Discrete space {space!r} starts at {space.start}; harness algorithms emit "
                f"actions 0..n-1. Wrap the env to shift its actions to start at 0."
            )
        return SpaceInfo("discrete", (), str(np.dtype(space.dtype)), n=int(space.n))
    if hasattr(space, "low") and hasattr(space, "high"):
        return SpaceInfo(
            "box",
            tuple(space.shape),
            str(np.dtype(space.dtype)),
            low=tuple(np.asarray(space.low, dtype=np.float64).ravel().tolist()),
            high=tuple(np.asarray(space.high, dtype=np.float64).ravel().tolist()),
        )
    raise IncompatibleError(
        f"Space {space!r} is neither discrete (has .n) nor a box (has .low/.high); harness "
        f"algorithms support those two. Wrap the env to flatten its spaces."
    )


def env_info(env_id: str, envs: Any) -> EnvInfo:
    """What an agent is told about ``envs``: a gymnasium vector env, or a multi-agent vector
    env (one with ``agents`` and per-agent ``single_observation_spaces`` /
    ``single_action_spaces`` dicts; see docs/multiagent.md)."""
    spaces = getattr(envs, "single_observation_spaces", None)
    if spaces is None:
        return EnvInfo(
            env_id=env_id,
            observation=space_info(envs.single_observation_space),
            action=space_info(envs.single_action_space),
            num_envs=int(envs.num_envs),
        )
    agents = tuple(envs.agents)
    observations = {a: space_info(spaces[a]) for a in agents}
    actions = {a: space_info(envs.single_action_spaces[a]) for a in agents}
    return EnvInfo(
        env_id=env_id,
        observation=observations[agents[0]],
        action=actions[agents[0]],
        num_envs=int(envs.num_envs),
        agents=agents,
        observations=observations,
        actions=actions,
    )
