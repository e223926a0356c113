"""The first-party plugins pass the conformance checks third-party authors use
(harness.testing), and each check fails on a deliberately broken component."""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import secrets
import subprocess
import sys
import warnings
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import pytest

from harness import hookimpl
from harness.api import Agent, EnvInfo, SpaceInfo
from harness.plugins import HarnessPluginManager, collect_registry, make_plugin_manager
from harness.policy import own_policy
from harness.registry import AlgorithmSpec, EnvSpec, Registry, TransportSpec
from harness.testing import check_algorithm, check_backend, check_env, check_transport

# CartPole-shaped (with its +-3.4e38 "bounds") and a 2-d box with asymmetric action bounds,
# so an agent that clips actions to [-1, 1] or ignores the low bound fails.
DISCRETE = EnvInfo(
    "discrete-test",
    SpaceInfo(
        "box",
        (4,),
        "float32",
        low=(-4.8, -3.4e38, -0.42, -3.4e38),
        high=(4.8, 3.4e38, 0.42, 3.4e38),
    ),
    SpaceInfo("discrete", (), "int64", n=2),
    num_envs=2,
)
BOX = EnvInfo(
    "box-test",
    SpaceInfo("box", (3,), "float32", low=(-1.0, -1.0, -8.0), high=(1.0, 1.0, 8.0)),
    SpaceInfo("box", (2,), "float32", low=(-2.0, 0.0), high=(2.0, 1.0)),
    num_envs=2,
)
INFOS = {"discrete": DISCRETE, "box": BOX}


def multi_agent_info(kind: str) -> EnvInfo:
    """A multi-agent EnvInfo shaped like mpe2's simple_adversary: agents with different
    observation sizes (8 and 10), so an agent that assumes one shared size fails."""
    obs = {
        "adversary_0": SpaceInfo("box", (8,), "float32"),
        "agent_0": SpaceInfo("box", (10,), "float32"),
        "agent_1": SpaceInfo("box", (10,), "float32"),
    }
    action = (
        SpaceInfo("discrete", (), "int64", n=5)
        if kind == "discrete"
        else SpaceInfo("box", (5,), "float32", low=(0.0,) * 5, high=(1.0,) * 5)
    )
    return EnvInfo(
        f"multi-agent-{kind}-test",
        obs["adversary_0"],
        action,
        num_envs=2,
        agents=tuple(obs),
        observations=obs,
        actions=dict.fromkeys(obs, action),
    )


MULTI_INFOS = {kind: multi_agent_info(kind) for kind in ("discrete", "box")}


@cache
def first_party() -> tuple[HarnessPluginManager, Registry]:
    """Every plugin the harness distribution itself declares, and nothing else installed."""
    names = [
        ep.name for ep in md.entry_points(group="harness") if ep.dist and ep.dist.name == "harness"
    ]
    pm = make_plugin_manager(autoload=False, load=names)
    return pm, collect_registry(pm)


def algorithm_cases() -> list[tuple[str, str]]:
    """(algorithm, case) for every algorithm and action space it supports; a case is the
    action kind, prefixed with "multi-" for a multi-agent env."""
    _, registry = first_party()
    cases = []
    for name, spec in registry.algorithms.items():
        for kind in spec.action_spaces:
            if spec.agents in ("single", "any"):
                cases.append((name, kind))
            if spec.agents in ("multi", "any"):
                cases.append((name, f"multi-{kind}"))
    return cases


def case_info(case: str) -> EnvInfo:
    if case.startswith("multi-"):
        return MULTI_INFOS[case.removeprefix("multi-")]
    return INFOS[case]


def test_first_party_plugins_load() -> None:
    pm, registry = first_party()
    assert not pm.broken
    assert {"gymnasium", "torch", "algos"} <= set(pm.infos)
    assert {"dqn", "ppo"} <= set(registry.algorithms)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_gymnasium_env_family_conforms(env_id: str) -> None:
    _, registry = first_party()
    spec = registry.env_for(env_id)
    assert spec.name == "gymnasium"
    check_env(spec, env_id)


def test_backend_conforms(harness_backend: Any) -> None:
    check_backend(harness_backend)


def conformance_config(spec: AlgorithmSpec, kind: str, directory: Any) -> Any:
    """None (the defaults) for an online algorithm. An offline one learns from a dataset: a
    small real Minari dataset of random transitions in the check's spaces, and small networks
    updated a few times per learn() (the check calls learn() every rollout_len = updates per
    iteration synthetic steps)."""
    from harness_algos.offline import OfflineConfig

    if not issubclass(spec.config_cls, OfflineConfig):
        return None
    pytest.importorskip("minari", reason="offline algorithms read Minari datasets")
    from harness_offline.testing import random_dataset

    dataset = random_dataset(directory / f"{kind}-random-v0", INFOS[kind])
    small = {"hidden": [16, 16], "vae_hidden": [16, 16], "batch_size": 32, "cql_samples": 3}
    names = {f.name for f in dataclasses.fields(spec.config_cls)}
    options = {k: v for k, v in small.items() if k in names}
    return spec.config_cls(dataset=str(dataset), updates_per_iteration=4, **options)


@pytest.mark.parametrize(("name", "kind"), algorithm_cases())
def test_first_party_algorithm_conforms(
    name: str, kind: str, harness_backend: Any, tmp_path: Any
) -> None:
    """Every algorithm on every installed backend (one algorithm file, two frameworks)."""
    spec = first_party()[1].algorithms.get(name)
    config = conformance_config(spec, kind, tmp_path)
    check_algorithm(spec, harness_backend, case_info(kind), config=config)


ACTING_HOOKS = (
    "sample",
    "predict",
    "episodes_ended",
    "predict_episodes_ended",
    "per_env_acting_state",
    "acts_by_rows",
    "sample_rows",
    "rows_ended",
)
"""The acting hooks of agents written before ``Policy`` (harness.policy.AgentPolicy's)."""


@pytest.mark.parametrize(("name", "kind"), algorithm_cases())
def test_first_party_algorithm_acts_through_a_policy_of_its_own(
    name: str, kind: str, torch_backend: Any, tmp_path: Any
) -> None:
    """Every first-party agent returns a policy of its own from ``Agent.policy()`` (never the
    deprecated adapter, which would warn) and overrides none of the old acting hooks."""
    spec = first_party()[1].algorithms.get(name)
    config = conformance_config(spec, kind, tmp_path) or spec.config_cls()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        agent = spec.make_agent(case_info(kind), torch_backend, config, seed=0, total_steps=10)
        assert own_policy(agent) is not None, f"{name} acts through the adapter"
    kept = [hook for hook in ACTING_HOOKS if getattr(type(agent), hook) is not getattr(Agent, hook)]
    assert not kept, f"{type(agent).__name__} still overrides Agent.{', '.join(kept)}"
    # and a process that only acts (a farm actor, the policy server) makes it without an
    # agent: test_first_party_algorithm_conforms checks that it acts as the agent's
    assert spec.acts_without_agent, f"{name} declares no make_algorithm / make_policy"


@pytest.mark.parametrize("name", ["cql", "cql-discrete"])
def test_offline_penalty_is_on_by_default_and_off_at_zero(name: str, tmp_path: Any) -> None:
    """The conservative penalty really enters the update (losses/cql_gap reported), and
    cql_alpha = 0 leaves the plain off-policy update (no gap computed)."""
    from harness.pytest_plugin import cpu_backend

    spec = first_party()[1].algorithms.get(name)
    kind = spec.action_spaces[0]
    base = conformance_config(spec, kind, tmp_path)
    for alpha, has_gap in ((1.0, True), (0.0, False)):
        config = dataclasses.replace(base, cql_alpha=alpha)
        backend = cpu_backend(first_party()[1], "torch")
        agent = spec.make_agent(INFOS[kind], backend, config, seed=0, total_steps=100)
        agent.load_data()
        metrics = agent.learn()
        assert ("losses/cql_gap" in metrics) == has_gap, metrics
        assert agent.updates == 4


# ------------------------------------------------------------------------------------------
# The checks fail on broken components


class VectorEnvProxy:
    """A vector env whose methods can be replaced one at a time."""

    def __init__(self, envs: Any, **overrides: Callable[..., Any]) -> None:
        self.envs = envs
        self.overrides = overrides

    def __getattr__(self, name: str) -> Any:
        if name in self.overrides:
            return lambda *args, **kwargs: self.overrides[name](self.envs, *args, **kwargs)
        return getattr(self.envs, name)


def gym_family(**overrides: Callable[..., Any]) -> EnvSpec:
    """The real gymnasium family, with some vector-env methods replaced."""
    real = first_party()[1].envs.get("gymnasium")

    def make_env(env_id: str, **kwargs: Any) -> Any:
        return VectorEnvProxy(real.make_env(env_id, **kwargs), **overrides)

    return EnvSpec("broken", make_env, real.accepts, real.config_cls, plugin="tests")


def shrink_obs(envs: Any, actions: Any) -> Any:
    obs, *rest = envs.step(actions)
    return (obs[:, :3], *rest)


def float64_obs(envs: Any, actions: Any) -> Any:
    obs, *rest = envs.step(actions)
    return (obs.astype(np.float64), *rest)


def ignore_seed(envs: Any, seed: Any = None, options: Any = None) -> Any:
    return envs.reset(seed=secrets.randbits(31))  # an env that seeds itself from entropy


BROKEN_ENVS = {
    "obs shape": (gym_family(step=shrink_obs), "obs shape"),
    "obs dtype": (gym_family(step=float64_obs), "obs dtype"),
    "ignores seed": (gym_family(reset=ignore_seed), "not deterministic"),
}


@pytest.mark.parametrize("case", BROKEN_ENVS)
def test_check_env_fails_on_broken_env(case: str) -> None:
    spec, message = BROKEN_ENVS[case]
    with pytest.raises(AssertionError, match=message):
        check_env(spec, "CartPole-v1")


class NextStepPlugin:
    """A plugin whose vector envs use gymnasium's default NEXT_STEP autoreset."""

    @hookimpl
    def harness_register_envs(self) -> list[EnvSpec]:
        def make_env(env_id: str, *, num_envs: int, seed: int | None, **_: Any) -> Any:
            import gymnasium as gym

            envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
            envs.reset(seed=seed)
            return envs

        return [EnvSpec("next_step", make_env, lambda env_id: env_id == "CartPole-v1")]


def test_check_env_fails_without_same_step_autoreset(harness_registry_factory: Any) -> None:
    _, registry = harness_registry_factory(NextStepPlugin())
    spec = registry.envs.get("next_step")
    assert spec.plugin == "NextStepPlugin"
    with pytest.raises(AssertionError, match="SAME_STEP") as excinfo:
        check_env(spec, "CartPole-v1")
    assert "env family 'next_step' (plugin 'NextStepPlugin')" in str(excinfo.value)


def test_check_env_needs_an_episode_to_end() -> None:
    _, registry = first_party()
    with pytest.raises(AssertionError, match="no episode ended within 5 steps"):
        check_env(registry.envs.get("gymnasium"), "Pendulum-v1", steps=5)


class BackendProxy:
    """The real torch backend with some methods replaced."""

    def __init__(self, backend: Any, **overrides: Callable[..., Any]) -> None:
        self.backend = backend
        self.overrides = overrides

    def __getattr__(self, name: str) -> Any:
        if name in self.overrides:
            return lambda *args, **kwargs: self.overrides[name](self.backend, *args, **kwargs)
        return getattr(self.backend, name)


def live_weights(bk: Any, model: Any) -> dict[str, Any]:
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}  # no copy


def no_step(bk: Any, optimizer: Any, loss: Any, max_grad_norm: float | None = None) -> float:
    loss.backward()
    optimizer.zero_grad()
    return 1.0


BROKEN_BACKENDS: dict[str, tuple[dict[str, Callable[..., Any]], str]] = {
    "gather": ({"gather": lambda bk, x, index: bk.gather(x, index * 0)}, "gather"),
    "mean ignores axis": ({"mean": lambda bk, x, axis=None: bk.mean(x)}, "mean"),
    "smooth_l1 is mse": ({"smooth_l1": lambda bk, a, b: bk.mse(a, b)}, "smooth_l1"),
    "categorical": (
        {"categorical": lambda bk, logits: bk.categorical(logits * 2.0)},
        "categorical",
    ),
    "no optimizer step": ({"update": no_step}, "do not train"),
    "tau ignored": ({"copy_weights": lambda bk, t, s, tau=1.0: bk.copy_weights(t, s)}, "tau=0.25"),
    "live weights": ({"get_weights": live_weights}, "must be a copy"),
    "rng state": ({"set_rng_state": lambda bk, state: None}, "set_rng_state"),
}


@pytest.mark.parametrize("case", BROKEN_BACKENDS)
def test_check_backend_fails_on_broken_backend(case: str, torch_backend: Any) -> None:
    overrides, message = BROKEN_BACKENDS[case]
    with pytest.raises(AssertionError, match=message):
        check_backend(BackendProxy(torch_backend, **overrides))


class AgentProxy:
    """A real agent with some methods replaced."""

    def __init__(self, agent: Any, **overrides: Callable[..., Any]) -> None:
        self.agent = agent
        self.overrides = overrides

    def __getattr__(self, name: str) -> Any:
        if name in self.overrides:
            return lambda *args, **kwargs: self.overrides[name](self.agent, *args, **kwargs)
        return getattr(self.agent, name)


def broken_ppo(**overrides: Callable[..., Any]) -> AlgorithmSpec:
    ppo = first_party()[1].algorithms.get("ppo")

    def make_agent(*args: Any, **kwargs: Any) -> Any:
        return AgentProxy(ppo.make_agent(*args, **kwargs), **overrides)

    return AlgorithmSpec("broken_ppo", make_agent, ppo.config_cls, plugin="tests")


def unsaved_rng_sample(agent: Any, obs: Any) -> Any:
    _, extras = agent.sample(obs)
    return np.random.default_rng().integers(0, 2, size=len(obs)), extras


BROKEN_AGENTS: dict[str, tuple[AlgorithmSpec, str]] = {
    "predict out of range": (
        broken_ppo(predict=lambda agent, obs: agent.predict(obs) + 2),
        r"outside \[0, 2\)",
    ),
    "restore is a no-op": (
        broken_ppo(restore=lambda agent, d, **kw: None),
        r"restore\(save\(\)\) gave different weights",
    ),
    "metrics not namespaced": (
        broken_ppo(learn=lambda agent: {"loss": 1.0, **agent.learn()}),
        "not namespaced",
    ),
    "nan metric": (
        broken_ppo(learn=lambda agent: {"losses/x": float("nan"), **agent.learn()}),
        "not a finite float",
    ),
    "sample RNG not saved": (broken_ppo(sample=unsaved_rng_sample), r"sample\(\) after save"),
}


@pytest.mark.parametrize("case", BROKEN_AGENTS)
def test_check_algorithm_fails_on_broken_agent(case: str, torch_backend: Any) -> None:
    spec, message = BROKEN_AGENTS[case]
    with pytest.raises(AssertionError, match=message):
        check_algorithm(spec, torch_backend, DISCRETE, steps=1024)


def test_check_algorithm_fails_when_learning_does_not_change_weights(torch_backend: Any) -> None:
    ppo = first_party()[1].algorithms.get("ppo")
    with pytest.raises(AssertionError, match=r"weights\(\) never changed"):
        check_algorithm(ppo, torch_backend, DISCRETE, config=ppo.config_cls(learning_rate=0.0))


def test_check_algorithm_refuses_an_unsupported_action_space(torch_backend: Any) -> None:
    with pytest.raises(AssertionError, match="action_spaces"):
        check_algorithm(first_party()[1].algorithms.get("dqn"), torch_backend, BOX)


def test_check_algorithm_refuses_a_single_agent_algorithm_on_a_multi_agent_env(
    torch_backend: Any,
) -> None:
    with pytest.raises(AssertionError, match="agents='single'"):
        check_algorithm(
            first_party()[1].algorithms.get("ppo"), torch_backend, MULTI_INFOS["discrete"]
        )


def broken_random(**overrides: Callable[..., Any]) -> AlgorithmSpec:
    """The multi-agent-capable random policy with some agent methods replaced."""
    real = first_party()[1].algorithms.get("random")

    def make_agent(*args: Any, **kwargs: Any) -> Any:
        return AgentProxy(real.make_agent(*args, **kwargs), **overrides)

    return AlgorithmSpec("broken_random", make_agent, real.config_cls, agents="any")


def drop_agent(agent: Any, obs: Any) -> Any:
    actions, extras = agent.sample(obs)
    return {k: v for k, v in actions.items() if k != "agent_1"}, extras


def stacked_actions(agent: Any, obs: Any) -> Any:
    return np.stack(list(agent.predict(obs).values()), axis=1)


def wrong_agent_space(agent: Any, obs: Any) -> Any:
    actions = agent.predict(obs)
    return {**actions, "adversary_0": actions["adversary_0"] + 5}  # valid for n=10, not n=5


BROKEN_MULTI_AGENTS: dict[str, tuple[AlgorithmSpec, str]] = {
    "an agent missing": (broken_random(sample=drop_agent), "dict keyed by the env's agents"),
    "actions not per agent": (broken_random(predict=stacked_actions), "dict keyed by"),
    "out of one agent's space": (
        broken_random(predict=wrong_agent_space),
        r"of agent 'adversary_0'.*outside \[0, 5\)",
    ),
}


@pytest.mark.parametrize("case", BROKEN_MULTI_AGENTS)
def test_check_algorithm_fails_on_broken_multi_agent_agent(case: str, torch_backend: Any) -> None:
    spec, message = BROKEN_MULTI_AGENTS[case]
    with pytest.raises(AssertionError, match=message):
        check_algorithm(spec, torch_backend, MULTI_INFOS["discrete"], steps=256)


class Connection:
    """A connection that is not a harness.remote.Client (no create_actor)."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    ("connect", "message"),
    [
        (lambda address: Connection(), "without create_actor"),
        (lambda: Connection(), "does not accept"),
        ("not callable", "not callable"),
    ],
)
def test_check_transport_fails_on_broken_transport(connect: Any, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_transport(TransportSpec("broken", connect))


@pytest.mark.distributed
def test_zmq_transport_passes_check_transport() -> None:
    """The real thing: an embedded ZeroMQ farm with real actor processes."""
    check_transport(first_party()[1].transports.get("zmq"))


# ------------------------------------------------------------------------------------------
# The pytest plugin's fixtures


def test_harness_pm_loads_no_entry_points(harness_pm: HarnessPluginManager) -> None:
    assert set(harness_pm.infos) == {"builtin"}
    assert list(collect_registry(harness_pm).trackers) == ["csv"]


class Empty:
    """A plugin that implements no hook."""


def test_registry_factory_registers_plugins_inline(harness_registry_factory: Any) -> None:
    pm, registry = harness_registry_factory(Empty(), Empty(), NextStepPlugin(), other=Empty())
    assert {"Empty", "Empty-2", "NextStepPlugin", "other"} <= set(pm.infos)
    assert registry.envs.get("next_step").plugin == "NextStepPlugin"
    assert "next_step" not in first_party()[1].envs  # each call builds a fresh manager


def test_registry_factory_reports_duplicates(harness_registry_factory: Any) -> None:
    _pm, registry = harness_registry_factory(NextStepPlugin(), NextStepPlugin())
    assert registry.envs.clashes == {"next_step": ["NextStepPlugin", "NextStepPlugin-2"]}


def test_torch_backend_fixture(torch_backend: Any) -> None:
    assert (torch_backend.name, torch_backend.device) == ("torch", "cpu")


def test_importing_the_test_helpers_imports_no_framework() -> None:
    code = (
        "import sys, harness.pytest_plugin, harness.testing; "
        "print(sorted(m for m in ('torch', 'gymnasium') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", ["ppo", "impala"])
def test_recurrent_on_policy_agents_conform_with_state_rows(
    name: str, harness_backend: Any
) -> None:
    """Recurrent PPO and IMPALA act through a policy whose recurrent state is explicit rows
    (what the steppers and the policy server keep): check_algorithm holds it to acting for any
    rows as for all, to not writing its state in place and to resetting ended rows, on every
    backend."""
    spec = first_party()[1].algorithms.get(name)
    config = spec.config_cls(recurrent="lstm", rnn_hidden=16)
    agent = spec.make_agent(case_info("discrete"), harness_backend, config, seed=0, total_steps=1)
    assert set(agent.policy().initial_state(3)) == {"rnn"}  # (so the state checks run)
    check_algorithm(spec, harness_backend, case_info("discrete"), config=config, steps=512)


@pytest.mark.parametrize("name", ["ppo", "impala"])
def test_correlated_noise_agents_conform_with_state_rows(name: str, harness_backend: Any) -> None:
    """``algo.noise_correlation`` makes each env's last exploration noise a state row of the
    policy (``noise``, ``noise_fresh``), kept and reset by whoever steps the envs, so a policy
    server acts as an actor's own stepper would; check_algorithm holds the policy to it."""
    spec = first_party()[1].algorithms.get(name)
    config = spec.config_cls(noise_correlation=0.9)
    agent = spec.make_agent(case_info("box"), harness_backend, config, seed=0, total_steps=1)
    assert set(agent.policy().initial_state(3)) == {"noise", "noise_fresh"}
    check_algorithm(spec, harness_backend, case_info("box"), config=config, steps=512)
