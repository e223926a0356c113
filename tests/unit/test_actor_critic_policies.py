"""The native policies of the actor-critic families (issue 49): SAC, TD3 and DDPG
(``OffPolicyPolicy``, DDPG's ensemble ``EnsemblePolicy``), MADDPG (``MADDPGPolicy``) and the
offline BCQ and CQL (``OfflinePolicy``). Exploring with ``rng=None`` draws from the agent's
own generator (what keeps a run's numbers those of the agent's old ``sample``), a generator
passed in is used instead; the ensemble's head per env is a state row, so exploring for any
rows with their state rows gives those rows' actions (a policy server's batch); an offline
policy explores greedily and draws nothing."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from harness.api import EnvInfo, SpaceInfo, tree_map
from harness.plugins import collect_registry, make_plugin_manager
from harness.policy import AgentPolicy
from harness.pytest_plugin import cpu_backend

ENVS = 5
ROWS = np.array([0, 3, 4])  # a subset of the envs, as a policy server's batch may be
BOX = EnvInfo(
    "unit-box",
    SpaceInfo("box", (3,), "float32"),
    SpaceInfo("box", (2,), "float32", low=(-2.0, 0.0), high=(2.0, 1.0)),
    num_envs=ENVS,
)


def multi(kind: str) -> EnvInfo:
    obs = {"a": SpaceInfo("box", (4,), "float32"), "b": SpaceInfo("box", (6,), "float32")}
    action = (
        SpaceInfo("discrete", (), "int64", n=4)
        if kind == "discrete"
        else SpaceInfo("box", (2,), "float32", low=(0.0, -1.0), high=(1.0, 1.0))
    )
    return EnvInfo(
        f"unit-multi-{kind}",
        obs["a"],
        action,
        num_envs=ENVS,
        agents=tuple(obs),
        observations=obs,
        actions=dict.fromkeys(obs, action),
    )


@pytest.fixture(scope="module")
def torch_backend() -> Any:
    pytest.importorskip("torch")
    return cpu_backend(collect_registry(make_plugin_manager()), "torch")


def make(name: str, backend: Any, seed: int = 0, **options: Any) -> Any:
    """A small agent of ``name`` (``ddpg3``: DDPG with 3 heads; ``maddpg-KIND``: on a
    two-agent env with KIND actions) that explores from its fourth env step on."""
    from harness_algos import bcq, cql, ddpg, maddpg, sac, td3

    options = {"hidden": [8], **options}
    if name.startswith("maddpg"):
        info = multi(name.removeprefix("maddpg-"))
        config: Any = maddpg.MADDPGConfig(learning_starts=4, **options)
        return maddpg.make_agent(info, backend, config, seed=seed)
    if name in ("bcq", "cql"):  # (offline: no warm-up)
        module: Any = {"bcq": bcq, "cql": cql}[name]
        config = (bcq.BCQConfig if name == "bcq" else cql.CQLConfig)(**options)
        return module.make_agent(BOX, backend, config, seed=seed)
    if name == "ddpg3":
        name, options["ensemble"] = "ddpg", 3
    module = {"sac": sac, "td3": td3, "ddpg": ddpg}[name]
    make_config = {"sac": sac.SACConfig, "td3": td3.TD3Config, "ddpg": ddpg.DDPGConfig}[name]
    return module.make_agent(BOX, backend, make_config(learning_starts=4, **options), seed=seed)


def observations(agent: Any, rows: int, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    info = agent.env_info
    if info.multi_agent:
        return {
            a: rng.standard_normal((rows, *s.shape)).astype(np.float32)
            for a, s in info.observations.items()
        }
    return rng.standard_normal((rows, *info.observation.shape)).astype(np.float32)


def twin(rng: np.random.Generator) -> np.random.Generator:
    copy = np.random.default_rng()
    copy.bit_generator.state = rng.bit_generator.state
    return copy


def assert_same(a: Any, b: Any) -> None:
    tree_map(np.testing.assert_array_equal, a, b)


@pytest.mark.parametrize("name", ["sac", "td3", "ddpg", "ddpg3", "maddpg-discrete", "maddpg-box"])
def test_exploring_draws_from_the_agents_generator(name: str, torch_backend: Any) -> None:
    """Before and after ``learning_starts`` (read from the agent's env steps at each act):
    ``rng=None`` acts as a copy of the agent's generator passed in does, and advances the
    agent's generator by exactly those draws; no extras."""
    agent = make(name, torch_backend, seed=7)
    policy = agent.policy()
    state = policy.initial_state(ENVS)
    obs = observations(agent, ENVS, 1)
    for env_steps in (0, 4):  # warm-up (uniform), then the algorithm's exploration
        agent.env_steps = env_steps
        copy = twin(agent.rng)
        expected, _, _ = policy.act(obs, state, copy, explore=True)
        actions, extras, state = policy.act(obs, state, explore=True)
        assert extras == {}
        assert_same(actions, expected)
        assert agent.rng.bit_generator.state == copy.bit_generator.state
    warm, _, _ = policy.act(obs, state, twin(agent.rng), explore=True)
    agent.env_steps = 0
    uniform, _, _ = policy.act(obs, state, twin(agent.rng), explore=True)
    with pytest.raises(AssertionError):  # (the two phases really act differently)
        assert_same(warm, uniform)


def test_ddpg_ensemble_explores_by_rows(torch_backend: Any) -> None:
    """Each row explores with its own head (its state row), so acting for a subset of the
    envs with their state rows gives those rows' actions of acting for all of them (noise 0:
    the noise draws are the only thing a subset changes), and a reset redraws the heads of
    the ended rows only, without writing into the state it was given."""
    agent = make("ddpg3", torch_backend, seed=2, exploration_noise=0.0)
    agent.env_steps = 4
    policy = agent.policy()
    obs = observations(agent, ENVS, 3)
    state = policy.reset(policy.initial_state(ENVS), np.ones(ENVS, bool), explore=True)
    assert set(state["head"].tolist()) <= {0, 1, 2}
    for _ in range(20):  # (rows that follow different heads)
        if len(set(state["head"].tolist())) > 1:
            break
        state = policy.reset(state, np.ones(ENVS, bool), explore=True)
    assert len(set(state["head"].tolist())) > 1
    every, _, after = policy.act(obs, state, explore=True)
    some, _, some_after = policy.act(obs[ROWS], {"head": state["head"][ROWS]}, explore=True)
    np.testing.assert_array_equal(some, every[ROWS])
    np.testing.assert_array_equal(some_after["head"], after["head"][ROWS])
    candidates = agent.algorithm.head_actions(obs)
    np.testing.assert_allclose(
        every, agent.to_env(candidates[state["head"], np.arange(ENVS)]), rtol=1e-6
    )
    held = state["head"].copy()
    ended = np.arange(ENVS) == 1
    reset = policy.reset(state, ended, explore=True)
    np.testing.assert_array_equal(state["head"], held)
    np.testing.assert_array_equal(reset["head"][~ended], held[~ended])


@pytest.mark.parametrize("name", ["bcq", "cql"])
def test_offline_policies_explore_greedily_and_draw_nothing(name: str, torch_backend: Any) -> None:
    """An offline agent never explores (``harness collect --noise`` adds noise of its own):
    its exploring actions are its greedy ones, with no extras, no state and no draws."""
    agent = make(name, torch_backend, seed=5)
    policy = agent.policy()
    assert not isinstance(policy, AgentPolicy)  # (a policy of its own: no acting hooks)
    obs = observations(agent, ENVS, 4)
    drawn = agent.rng.bit_generator.state
    explored, extras, state = policy.act(obs, policy.initial_state(ENVS), explore=True)
    greedy, _, _ = policy.act(obs, state, explore=False)
    assert extras == {} and state == {}
    np.testing.assert_array_equal(explored, greedy)
    np.testing.assert_allclose(greedy, agent.scale.to_env(agent.algorithm.act(obs)), rtol=0)
    assert agent.rng.bit_generator.state == drawn


@pytest.mark.parametrize("kind", ["discrete", "box"])
def test_maddpg_policy_without_an_agent_reads_its_parts_at_each_act(
    kind: str, torch_backend: Any
) -> None:
    """A farm actor's MADDPG policy (``make_policy`` of an ``Acting``, no agent) reads the
    warm-up's env-step count and the generator from its parts at each act, not when it was
    made: the actor moves ``env_steps`` with each broadcast and rollout."""
    from harness.policy import Acting
    from harness_algos import maddpg

    info, config = multi(kind), maddpg.MADDPGConfig(hidden=[8], learning_starts=4)
    acting = Acting(
        maddpg.make_algorithm(torch_backend, info, config), info, config, np.random.default_rng(1)
    )
    policy = maddpg.make_policy(acting)
    obs, state = observations(acting, ENVS, 2), policy.initial_state(ENVS)
    acted = []
    for env_steps, seed in ((0, 3), (4, 3), (4, 8)):  # warm-up, explore, another generator
        acting.env_steps, acting.rng = env_steps, np.random.default_rng(seed)
        expected, _, _ = policy.act(obs, state, np.random.default_rng(seed), explore=True)
        actions, _, state = policy.act(obs, state, explore=True)
        assert_same(actions, expected)
        assert acting.rng.bit_generator.state != np.random.default_rng(seed).bit_generator.state
        acted.append(actions)
    for before, after in itertools.pairwise(acted):  # (each change of the parts is followed)
        with pytest.raises(AssertionError):
            assert_same(before, after)
