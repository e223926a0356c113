"""EnvStepper.rollout (what farm actors run) gives what EnvStepper.step gives step by step."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from harness.api import EnvInfo
from harness.runtime import EnvStepper, Episode
from harness.runtime.spaces import env_info
from harness_algos.random_policy import RandomConfig, make_agent
from harness_gymnasium.plugin import GymConfig, make_env
from harness_gymnasium.vector import LeanSyncVectorEnv


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
    finished_a: list[Episode] = []
    finished_b: list[Episode] = []
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
        np.array([e[:2] for e in finished_a], dtype=float),
        np.array([e[:2] for e in finished_b], dtype=float),
        rtol=1e-9,
    )
    assert [e[2] for e in finished_a] == [e[2] for e in finished_b]
    np.testing.assert_allclose(a.ep_return, b.ep_return, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(a.ep_length, b.ep_length)


class _Scored(gym.Wrapper):  # type: ignore[type-arg]
    """Reports an episode metric the way competition envs do: ``info["episode_metrics"]`` in
    the info of the step that ends the episode (here: twice the return, and the length)."""

    def reset(self, **kwargs: Any) -> Any:
        self.total, self.steps = 0.0, 0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        obs, reward, term, trunc, info = self.env.step(action)
        self.total += float(reward)
        self.steps += 1
        if term or trunc:
            info = dict(info, episode_metrics={"double": 2 * self.total, "steps": self.steps})
        return obs, reward, term, trunc, info


@pytest.mark.parametrize("mode", ["step", "rollout"])
def test_episode_metrics_reach_the_finished_list(mode: str) -> None:
    """Per-episode metrics of the env arrive with each finished episode, for the right env and
    episode, in both stepping paths (serial runs and farm actors)."""

    fns = []
    for k in range(3):  # different lengths per env: episodes end at different steps
        fns.append(lambda k=k: _Scored(gym.make("Pendulum-v1", max_episode_steps=7 + 3 * k)))
    envs = LeanSyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    info: EnvInfo = env_info("Pendulum-v1", envs)
    agent = make_agent(info, None, RandomConfig(), seed=3)  # type: ignore[arg-type]
    agent.rng = np.random.default_rng(0)
    stepper = EnvStepper(envs, seed=1)
    finished: list[Episode] = []
    if mode == "step":
        for _ in range(40):
            stepper.step(agent, finished)
    else:
        stepper.rollout(agent, 40, finished)
    assert len(finished) >= 8
    for ep_return, length, metrics in finished:
        assert metrics == {"double": pytest.approx(2 * ep_return), "steps": float(length)}
    assert {length for _, length, _ in finished} == {7, 10, 13}


def test_multi_agent_rollout_matches_step_by_step() -> None:
    """A multi-agent env's agent-keyed observations, actions and rewards go through both
    stepping paths alike: the rollout's time-major dicts equal the steps stacked, the true final
    observations replace the reset ones where episodes ended, and the team return (sum over
    agents) of every finished episode equals its per-agent returns' sum."""
    pytest.importorskip("mpe2", reason="pip install 'harness[multiagent]'")
    from harness_pettingzoo.plugin import PettingZooConfig
    from harness_pettingzoo.plugin import make_env as make_ma_env

    def stepper_and_agent() -> tuple[EnvStepper, Any]:
        options = PettingZooConfig(max_cycles=9)
        envs = make_ma_env("mpe2/simple_adversary_v3", num_envs=2, seed=None, options=options)
        info = env_info("mpe2/simple_adversary_v3", envs)
        assert info.agents == ("adversary_0", "agent_0", "agent_1")
        agent = make_agent(info, None, RandomConfig(), seed=3)  # type: ignore[arg-type]
        agent.rng = np.random.default_rng(42)
        return EnvStepper(envs, seed=7), agent

    (a, agent_a), (b, agent_b) = stepper_and_agent(), stepper_and_agent()
    agents = agent_a.env_info.agents
    finished_a: list[Episode] = []
    finished_b: list[Episode] = []
    chunks = []
    for _ in range(3):
        chunk = a.rollout(agent_a, 8, finished_a)
        ts = [b.step(agent_b, finished_b) for _ in range(8)]
        for name in ("obs", "actions", "rewards", "next_obs"):
            assert set(chunk[name]) == set(agents), name
            for who, value in chunk[name].items():
                want = np.stack([getattr(t, name)[who] for t in ts])
                np.testing.assert_array_equal(value, want, err_msg=f"{name}[{who}]")
        for name in ("terminated", "truncated"):
            want = np.stack([getattr(t, name) for t in ts])
            np.testing.assert_array_equal(chunk[name], want, err_msg=name)
        chunks.append(chunk)
    obs = np.concatenate([c["obs"]["agent_0"] for c in chunks])
    next_obs = np.concatenate([c["next_obs"]["agent_0"] for c in chunks])
    ended = np.concatenate([c["truncated"] for c in chunks])
    assert ended.sum() == 4  # 24 steps of 2 envs, episodes of 9 steps
    for t in range(len(obs) - 1):  # next_obs is the next obs, except the final one at an end
        for i in range(2):
            same = np.array_equal(next_obs[t, i], obs[t + 1, i])
            assert same != ended[t, i], (t, i)
    assert len(finished_a) == len(finished_b) == 4
    for (ret_a, len_a, metrics_a), (ret_b, len_b, _) in zip(finished_a, finished_b, strict=True):
        assert len_a == len_b == 9
        assert ret_a == pytest.approx(ret_b, abs=1e-9)
        parts = [metrics_a[f"return/{who}"] for who in agents]
        assert ret_a == pytest.approx(sum(parts), abs=1e-9)
