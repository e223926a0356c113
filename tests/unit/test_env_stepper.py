"""EnvStepper.rollout (what farm actors run) gives what EnvStepper.step gives step by step."""

from __future__ import annotations

import numpy as np
import pytest

from harness.api import EnvInfo
from harness.runtime.run import EnvStepper
from harness.runtime.spaces import env_info
from harness_algos.random_policy import RandomConfig, make_agent
from harness_gymnasium.plugin import GymConfig, make_env


def _stepper_and_agent(env_id: str, options: GymConfig, n: int) -> tuple[EnvStepper, object]:
    envs = make_env(env_id, num_envs=n, options=options)
    info: EnvInfo = env_info(env_id, envs)
    agent = make_agent(info, None, RandomConfig(), seed=3)  # type: ignore[arg-type]
    agent.rng = np.random.default_rng(42)
    return EnvStepper(envs, seed=7), agent


@pytest.mark.parametrize(
    ("env_id", "options"),
    [
        ("CartPole-v1", GymConfig()),  # terminations at different times per env
        ("Pendulum-v1", GymConfig(max_episode_steps=23)),  # truncations, float rewards
    ],
)
def test_rollout_matches_step_by_step(env_id: str, options: GymConfig) -> None:
    n, steps, rounds = 3, 16, 12
    a, agent_a = _stepper_and_agent(env_id, options, n)
    b, agent_b = _stepper_and_agent(env_id, options, n)
    finished_a: list[tuple[float, int]] = []
    finished_b: list[tuple[float, int]] = []
    for _ in range(rounds):
        chunk = a.rollout(agent_a, steps, finished_a)
        ts = [b.step(agent_b, finished_b) for _ in range(steps)]
        for name in ("obs", "actions", "rewards", "next_obs", "terminated", "truncated"):
            want = np.stack([getattr(t, name) for t in ts])
            assert chunk[name].dtype == want.dtype, name
            np.testing.assert_array_equal(chunk[name], want, err_msg=name)
        assert chunk["extras"] == {}
    assert len(finished_a) == len(finished_b) > 3, "no episode ended: the test proves nothing"
    np.testing.assert_allclose(
        np.array(finished_a, dtype=float), np.array(finished_b, dtype=float), rtol=1e-9
    )
    np.testing.assert_allclose(a.ep_return, b.ep_return, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(a.ep_length, b.ep_length)
