"""The acting interface (harness.policy): whatever steps envs acts through Agent.policy(), and
check_algorithm holds every policy to its contract. A policy with explicit per-env state (one
of its own, over a real PPO agent's networks) passes; three mistakes are caught, each as a
mutant of it or of a real agent: acting that depends on the other rows of the batch, acting
that writes into the state it was given, and a load() that leaves the policy on its old
weights. The stepper owns the state and resets the rows whose episodes ended."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from test_conformance import DISCRETE, first_party  # same directory: on sys.path

from harness.api import Agent
from harness.policy import AgentPolicy, Policy, State
from harness.policy import own_policy as own_policy_of
from harness.registry import AlgorithmSpec
from harness.runtime import EnvStepper
from harness.testing import check_algorithm


class StepCounting(Policy):
    """A policy of its own: greedy and exploratory actions from an acting agent built from the
    same spec (its own networks, loaded from weights), plus a per-env state that counts each
    row's steps in its episode (returned in the extras, as a recurrent policy returns its
    state)."""

    def __init__(self, acting: Any, *, in_place: bool = False, loads: bool = True) -> None:
        self.acting = acting
        self.in_place = in_place
        self.loads = loads

    def initial_state(self, rows: int) -> State:
        return {"steps": np.zeros(rows, np.int64)}

    def act(
        self, obs: Any, state: State, rng: np.random.Generator | None = None, *, explore: bool
    ) -> tuple[Any, dict[str, np.ndarray], State]:
        if self.in_place:  # the mutant: the caller's array is changed under it
            steps = state["steps"]
            steps += 1
        else:
            steps = state["steps"] + 1
        if explore:
            actions, extras = self.acting.sample(obs)
            return actions, {**extras, "steps": steps}, {"steps": steps}
        return self.acting.predict(obs), {}, {"steps": steps}

    def load(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        if self.loads:
            self.acting.set_weights(weights)
        self.version = version


class WithPolicy:
    """A real agent whose policy() is ``make(agent)``."""

    def __init__(self, agent: Any, make: Any) -> None:
        self.agent = agent
        self.make = make

    def policy(self) -> Policy:
        return self.make(self.agent)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.agent, name)


def ppo_with(make: Any) -> AlgorithmSpec:
    ppo = first_party()[1].algorithms.get("ppo")

    def make_agent(*args: Any, **kwargs: Any) -> Any:
        agent = ppo.make_agent(*args, **kwargs)
        return WithPolicy(agent, make)

    return AlgorithmSpec("policy_ppo", make_agent, ppo.config_cls, plugin="tests")


def own_policy(in_place: bool = False, loads: bool = True) -> Any:
    def make(agent: Any) -> Policy:
        return StepCounting(agent, in_place=in_place, loads=loads)

    return make


def batch_standardised(agent: Any) -> Policy:
    """The classic mistake: observations standardised by the batch's own statistics."""

    class BatchDependent(AgentPolicy):
        def act(self, obs: Any, state: State, rng: Any = None, *, explore: bool) -> Any:
            obs = (obs - obs.mean(axis=0)) / (obs.std(axis=0) + 1e-8)
            return super().act(obs, state, rng, explore=explore)

    return BatchDependent(agent)


def test_a_policy_with_explicit_state_passes(torch_backend: Any) -> None:
    check_algorithm(ppo_with(own_policy()), torch_backend, DISCRETE, steps=1024)


MUTANTS = {
    "acts on the batch": (batch_standardised, r"must depend on that row's observation"),
    "writes its state in place": (own_policy(in_place=True), r"changed its state argument"),
    "load keeps the old weights": (own_policy(loads=False), r"after load\(\) of the learner"),
}


@pytest.mark.parametrize("case", MUTANTS)
def test_check_algorithm_catches_a_broken_policy(case: str, torch_backend: Any) -> None:
    make, message = MUTANTS[case]
    with pytest.raises(AssertionError, match=message):
        check_algorithm(ppo_with(make), torch_backend, DISCRETE, steps=1024)


class HooksOnly(Agent):
    """An agent written before ``Policy``: it acts through ``sample`` / ``predict`` (a real
    PPO agent's) and has no ``policy()`` of its own."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner.algorithm, inner.env_info, inner.config)
        self.inner, self.rollout_len = inner, inner.rollout_len

    def sample(self, obs: Any) -> Any:
        return self.inner.sample(obs)

    def predict(self, obs: Any) -> Any:
        return self.inner.predict(obs)

    def observe(self, transition: Any) -> None:
        self.inner.observe(transition)

    def learn(self) -> dict[str, float]:
        return self.inner.learn()

    def save(self, directory: Any) -> None:
        self.inner.save(directory)

    def restore(self, directory: Any, *, with_data: bool = True) -> None:
        self.inner.restore(directory, with_data=with_data)


def test_an_agent_written_before_policy_acts_through_its_hooks_with_a_warning(
    torch_backend: Any,
) -> None:
    ppo = first_party()[1].algorithms.get("ppo")

    def make_agent(*args: Any, **kwargs: Any) -> HooksOnly:
        return HooksOnly(ppo.make_agent(*args, **kwargs))

    agent = make_agent(DISCRETE, torch_backend, ppo.config_cls(), seed=0, total_steps=10)
    with pytest.warns(DeprecationWarning, match=r"HooksOnly acts through.*Agent\.policy\(\)"):
        policy = agent.policy()
    assert isinstance(policy, AgentPolicy) and own_policy_of(agent) is None
    obs = np.zeros((DISCRETE.num_envs, *DISCRETE.observation.shape), np.float32)
    actions, extras, state = policy.act(obs, policy.initial_state(len(obs)), explore=True)
    again = agent.sample(obs)  # (the same hooks: the agent's RNG moved on in between)
    assert actions.shape == again[0].shape == (len(obs),) and set(extras) == set(again[1])
    assert state == {}
    spec = AlgorithmSpec("hooks_only", make_agent, ppo.config_cls, plugin="tests")
    check_algorithm(spec, torch_backend, DISCRETE, steps=1024)  # (the adapter conforms)


def test_the_stepper_owns_the_state_and_resets_ended_rows() -> None:
    """A real CartPole vector env stepped through a policy with explicit state: each row's
    count is its episode's length so far, back to 0 (then 1) after its episode ends."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    from harness_gymnasium.vector import LeanSyncVectorEnv

    class Counting(Policy):
        def initial_state(self, rows: int) -> State:
            return {"steps": np.zeros(rows, np.int64)}

        def act(self, obs: Any, state: State, rng: Any = None, *, explore: bool) -> Any:
            steps = state["steps"] + 1
            return np.zeros(len(obs), np.int64), {"steps": steps}, {"steps": steps}

    fns = [lambda: gym.make("CartPole-v1") for _ in range(3)]
    envs = LeanSyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)  # (as harness's)
    stepper = EnvStepper(envs, seed=3)
    policy = Counting()
    finished: list[Any] = []
    lengths = np.zeros(3, np.int64)
    for _ in range(40):  # always pushing left: every episode ends within ~10 steps
        transition = stepper.step(policy, finished)
        lengths += 1
        np.testing.assert_array_equal(transition.extras["steps"], lengths)
        done = transition.terminated | transition.truncated
        lengths[done] = 0
        np.testing.assert_array_equal(stepper.state["steps"], lengths)
    assert len(finished) >= 3
    chunk = stepper.rollout(policy, 30, finished)  # the farm's path keeps the same state
    steps = chunk["extras"]["steps"]
    done = chunk["terminated"] | chunk["truncated"]
    for t in range(1, 30):
        expected = np.where(done[t - 1], 1, steps[t - 1] + 1)
        np.testing.assert_array_equal(steps[t], expected)
    envs.close()
