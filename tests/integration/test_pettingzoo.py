"""The PettingZoo env plugin: mpe2 and generic PettingZoo envs as multi-agent vector envs.

- conformance: harness.testing.check_env on mpe2 tasks (both APIs, discrete and continuous)
  and PettingZoo's own api tests on the envs the plugin builds;
- the vector semantics against the raw PettingZoo env stepped by hand: seeding (copy i gets
  seed + i), SAME_STEP autoreset with the true final observations, per-agent returns as
  ``return/<agent>`` episode metrics, the AEC and parallel adapters giving identical
  trajectories, black death for agents that leave early (a small env written here);
- the runner: the random policy trained on mpe2/simple_spread_v3 serially and over a 2-actor
  farm (episodes counted, per-agent returns in metrics.csv summing to the team's), and a
  single-agent algorithm refused at start-up;
- clear errors: unknown task, constructor argument, API, space, missing package.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv  # type: ignore[import-untyped]
from pettingzoo.utils.conversions import parallel_to_aec  # type: ignore[import-untyped]

from harness.config import layer, resolve
from harness.errors import ConfigError, IncompatibleError, PluginError
from harness.plugins import collect_registry, make_plugin_manager
from harness.testing import check_env
from harness_pettingzoo.plugin import PettingZooConfig, constructor, make_env

with warnings.catch_warnings():  # (pettingzoo.test imports envs of its own deprecated API)
    warnings.simplefilter("ignore", DeprecationWarning)
    from pettingzoo.test import api_test, parallel_api_test  # type: ignore[import-untyped]

SPREAD = "mpe2/simple_spread_v3"


@pytest.fixture(scope="module")
def registry() -> Any:
    return collect_registry(make_plugin_manager())


def random_actions(envs: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for agent, space in envs.single_action_spaces.items():
        if isinstance(space, spaces.Discrete):
            out[agent] = rng.integers(0, space.n, envs.num_envs)
        else:
            out[agent] = rng.uniform(space.low, space.high, (envs.num_envs, *space.shape))
    return out


# ------------------------------------------------------------------------------------------
# A small env with agents leaving early, written against PettingZoo's ParallelEnv API


class Leavers(ParallelEnv[str, np.ndarray, int]):  # type: ignore[misc]
    """Agents a, b, c; observation [t, index] (float64); reward index + 1 + action / 10. c
    terminates at t = 2; a and b terminate at t = 4, or are truncated at t = max_cycles if
    that comes first."""

    metadata: ClassVar[dict[str, Any]] = {"name": "leavers_v0"}

    def __init__(self, max_cycles: int = 100) -> None:
        self.possible_agents = ["a", "b", "c"]
        self.render_mode = None
        self.agents: list[str] = []
        self.max_cycles = max_cycles
        self.t = 0
        self.received: list[dict[str, int]] = []
        self._obs_space = spaces.Box(-1.0, 100.0, (2,), np.float64)
        self._act_space = spaces.Discrete(3)

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return self._act_space

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.possible_agents.index(agent)], np.float64)

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]) -> Any:
        self.received.append(dict(actions))
        self.t += 1
        agents = self.agents
        obs = {a: self._obs(a) for a in agents}
        rewards = {a: self.possible_agents.index(a) + 1 + actions[a] / 10 for a in agents}
        terms = {a: (a == "c" and self.t == 2) or (a != "c" and self.t == 4) for a in agents}
        truncs = {a: self.t >= self.max_cycles and not terms[a] for a in agents}
        self.agents = [a for a in agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, {a: {} for a in agents}


class OddSpaces(Leavers):
    def observation_space(self, agent: str) -> spaces.Space[Any]:
        if agent == "b":
            return spaces.MultiDiscrete([2, 3])
        return super().observation_space(agent)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A third-party env module ``toy_marl`` (parallel_env, env, and odd_spaces factory)."""
    module = types.ModuleType("toy_marl")
    module.parallel_env = Leavers  # type: ignore[attr-defined]
    module.env = lambda **kw: parallel_to_aec(Leavers(**kw))  # type: ignore[attr-defined]
    module.odd_spaces = OddSpaces  # type: ignore[attr-defined]
    aec_only = types.ModuleType("toy_marl_aec")
    aec_only.env = module.env  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "toy_marl", module)
    monkeypatch.setitem(sys.modules, "toy_marl_aec", aec_only)
    yield "pettingzoo:toy_marl"


def test_toy_env_is_a_valid_pettingzoo_env() -> None:
    parallel_api_test(Leavers(), num_cycles=20)


# ------------------------------------------------------------------------------------------
# Conformance


def test_listing_plugins_imports_neither_pettingzoo_nor_mpe2() -> None:
    code = (
        "import sys\n"
        "from harness.plugins import collect_registry, make_plugin_manager\n"
        "r = collect_registry(make_plugin_manager())\n"
        f"assert r.env_for({SPREAD!r}).name == 'pettingzoo'\n"
        "assert 'mpe2/simple_adversary_v3' in r.envs.get('pettingzoo').known_ids()\n"
        "bad = [m for m in ('pettingzoo', 'mpe2') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    ("env_id", "options"),
    [
        (SPREAD, PettingZooConfig()),
        (SPREAD, PettingZooConfig(api="aec", N=2, local_ratio=0.25)),
        ("mpe2/simple_adversary_v3", PettingZooConfig(continuous_actions=True, max_cycles=10)),
        ("mpe2/simple_reference_v3", PettingZooConfig(api="aec", max_cycles=10)),
    ],
    ids=["spread", "spread-aec", "adversary-continuous", "reference-aec"],
)
def test_mpe2_envs_conform(registry: Any, env_id: str, options: PettingZooConfig) -> None:
    check_env(registry.env_for(env_id), env_id, steps=60, options=options)


def test_black_death_env_conforms(registry: Any, toy: str) -> None:
    check_env(registry.env_for(toy), toy, steps=12)


@pytest.mark.parametrize("api", ["parallel", "aec"])
def test_pettingzoo_api_tests_pass_on_the_envs_built(api: str) -> None:
    """PettingZoo's own api tests on exactly what the adapter steps (its constructor with
    the [env] options applied)."""
    options = PettingZooConfig(api=api, max_cycles=15, continuous_actions=True)
    env = constructor("mpe2/simple_adversary_v3", options)()
    if api == "parallel":
        parallel_api_test(env, num_cycles=40)
    else:
        api_test(env, num_cycles=40)
    assert env.unwrapped.max_cycles == 15 and env.unwrapped.continuous_actions


# ------------------------------------------------------------------------------------------
# Vector semantics


def test_copies_are_seeded_with_seed_plus_index() -> None:
    envs = make_env(SPREAD, num_envs=3)
    obs, _ = envs.reset(seed=7)
    for i in range(3):
        raw = constructor(SPREAD, PettingZooConfig())()
        expected, _ = raw.reset(seed=7 + i)
        for agent in envs.agents:
            assert obs[agent].dtype == np.float32
            np.testing.assert_array_equal(obs[agent][i], expected[agent])
    assert not np.array_equal(obs["agent_0"][0], obs["agent_0"][1])


def test_autoreset_final_obs_and_returns_match_the_raw_env() -> None:
    """Two episodes of 5 steps against raw PettingZoo envs stepped by hand with the same
    seeds and actions: every observation, the final observations, the reset observations
    (the copies' generators go on) and each agent's episode return."""
    n, cycles = 2, 5
    options = PettingZooConfig(max_cycles=cycles)
    envs = make_env(SPREAD, num_envs=n, options=options)
    raws = [constructor(SPREAD, options)() for _ in range(n)]
    obs, _ = envs.reset(seed=11)
    raw_obs = [raw.reset(seed=11 + i)[0] for i, raw in enumerate(raws)]
    returns = np.zeros((n, len(envs.agents)))
    rng = np.random.default_rng(0)
    for t in range(2 * cycles):
        actions = random_actions(envs, rng)
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        for i, raw in enumerate(raws):
            o, r, _, _, _ = raw.step({a: int(actions[a][i]) for a in raw.agents})
            returns[i] += [r[a] for a in envs.agents]
            for a in envs.agents:
                assert rewards[a][i] == pytest.approx(r[a])
            raw_obs[i] = o
        end = (t + 1) % cycles == 0
        assert list(truncated) == [end] * n and not terminated.any()
        if not end:
            assert infos == {}
            for i in range(n):
                for a in envs.agents:
                    np.testing.assert_array_equal(obs[a][i], raw_obs[i][a])
            continue
        assert list(infos["_final_obs"]) == [True] * n
        metrics = infos["final_info"]["episode_metrics"]
        for i, raw in enumerate(raws):
            assert not raw.agents
            reset_obs, _ = raw.reset()
            for j, a in enumerate(envs.agents):
                np.testing.assert_array_equal(infos["final_obs"][a][i], raw_obs[i][a])
                np.testing.assert_array_equal(obs[a][i], reset_obs[a])
                assert metrics[f"return/{a}"][i] == pytest.approx(returns[i, j])
                assert metrics[f"_return/{a}"][i]
        returns[:] = 0.0


def test_aec_and_parallel_give_identical_trajectories() -> None:
    """mpe2 simple_spread through env() (AEC, stepped one cycle per vector step) and through
    parallel_env(), same seed and actions, over 3 episodes of 3 copies."""
    runs = []
    for api in ("parallel", "aec"):
        envs = make_env(SPREAD, num_envs=3, options=PettingZooConfig(api=api, max_cycles=8))
        rng = np.random.default_rng(5)
        record = [envs.reset(seed=3)[0]]
        for _ in range(24):
            obs, rewards, terminated, truncated, infos = envs.step(random_actions(envs, rng))
            record.append((obs, rewards, terminated, truncated, infos))
        runs.append(record)
        envs.close()
    flat = [[_flatten(step) for step in run] for run in runs]
    assert len(flat[0]) == len(flat[1])
    ended = 0
    for first, second in zip(*flat, strict=True):
        assert first.keys() == second.keys()
        for key in first:
            np.testing.assert_array_equal(first[key], second[key], err_msg=key)
        ended += any("final_obs" in k for k in first)
    assert ended == 3


def test_aec_and_parallel_agree_when_agents_die_early() -> None:
    """knights_archers_zombies: agents killed by zombies leave mid-episode (black death, in
    both adapters alike) while the others play on."""
    env_id = "pettingzoo:pettingzoo.butterfly.knights_archers_zombies_v11"
    kwargs = {"obs_method": "vector", "spawn_delay": 5, "max_zombies": 20}
    runs, early = [], 0
    for api in ("parallel", "aec"):
        options = PettingZooConfig(api=api, max_cycles=300, kwargs=kwargs)
        envs = make_env(env_id, num_envs=2, options=options)
        rng = np.random.default_rng(1)
        record = [envs.reset(seed=5)[0]]
        for _ in range(250):
            out = envs.step(random_actions(envs, rng))
            record.append(out)
            dead = [(x == 0).all(axis=1) for x in out[0].values()]
            early += int(np.any(dead, axis=0)[~(out[2] | out[3])].sum())
        runs.append([_flatten(step) for step in record])
        envs.close()
    assert early > 0, "no agent left an episode early: the test checks nothing"
    for first, second in zip(*runs, strict=True):
        assert first.keys() == second.keys()
        for key in first:
            np.testing.assert_array_equal(first[key], second[key], err_msg=key)


def _flatten(x: Any, prefix: str = "") -> dict[str, np.ndarray]:
    if isinstance(x, dict):
        out: dict[str, np.ndarray] = {}
        for k, v in x.items():
            out.update(_flatten(v, f"{prefix}/{k}"))
        return out
    if isinstance(x, tuple):
        out = {}
        for k, v in enumerate(x):
            out.update(_flatten(v, f"{prefix}/{k}"))
        return out
    return {prefix: np.asarray(x)}


@pytest.mark.parametrize("api", ["parallel", "aec"])
@pytest.mark.parametrize(("max_cycles", "how"), [(100, "terminated"), (3, "truncated")])
def test_agents_that_leave_get_black_death(toy: str, api: str, max_cycles: int, how: str) -> None:
    """c leaves at t = 2: its observations and rewards are zero from then on and its actions
    are not passed to the env; the episode ends when a and b leave (t = 4 terminated, or
    truncated at t = 3); each agent's return counts only its own steps."""
    envs = make_env(toy, num_envs=2, options=PettingZooConfig(api=api, max_cycles=max_cycles))
    obs, _ = envs.reset(seed=0)
    assert envs.single_observation_space.dtype == np.float32
    np.testing.assert_array_equal(obs["c"], [[0, 2], [0, 2]])
    actions = {"a": np.array([1, 2]), "b": np.array([0, 1]), "c": np.array([2, 2])}
    length = min(4, max_cycles)
    for t in range(1, length + 1):
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        for a in ("a", "b"):
            index = "ab".index(a)
            want = [[t, index]] * 2 if t < length else [[0, index]] * 2  # reset on the end
            np.testing.assert_array_equal(obs[a], want)
            np.testing.assert_allclose(rewards[a], index + 1 + actions[a] / 10)
        if t <= 2:
            np.testing.assert_array_equal(obs["c"], [[t, 2]] * 2)  # c's own last observation
            np.testing.assert_allclose(rewards["c"], [3.2, 3.2])
        else:
            expected_c = [[0, 2]] * 2 if t == length else [[0, 0]] * 2  # reset obs, or zeros
            np.testing.assert_array_equal(obs["c"], expected_c)
            np.testing.assert_array_equal(rewards["c"], [0.0, 0.0])
        if t < length:
            assert infos == {} and not (terminated | truncated).any()
    assert (terminated.all(), truncated.all()) == (how == "terminated", how == "truncated")
    final = infos["final_obs"]
    np.testing.assert_array_equal(final["a"], [[length, 0]] * 2)
    np.testing.assert_array_equal(final["b"], [[length, 1]] * 2)
    np.testing.assert_array_equal(final["c"], [[0, 0]] * 2)  # left earlier: zeros
    metrics = infos["final_info"]["episode_metrics"]
    np.testing.assert_allclose(metrics["return/a"], length * (1 + actions["a"] / 10))
    np.testing.assert_allclose(metrics["return/b"], length * (2 + actions["b"] / 10))
    np.testing.assert_allclose(metrics["return/c"], [6.4, 6.4])
    if api == "parallel":
        received = envs.envs[0].received
        assert [sorted(r) for r in received] == [["a", "b", "c"]] * 2 + [["a", "b"]] * (length - 2)


# ------------------------------------------------------------------------------------------
# The runner


def train_random(
    tmp_path: Path, extra: list[str], algo: str = "random"
) -> tuple[Any, list[dict[str, str]]]:
    from harness.runtime import train

    pm = make_plugin_manager()
    registry = collect_registry(pm)
    overrides = [
        f"algo='{algo}'",
        f"env='{SPREAD}'",
        *(["algo.rollout_len=25"] if algo == "random" else []),
        "total_steps=400",
        "log_every=100",
        "eval_every=0",
        "eval_episodes=2",
        "checkpoint_every=0",
        "trackers=['csv']",
        "progress=false",
        f"out='{tmp_path}'",
        *extra,
    ]
    config = resolve(layer(None, [], overrides, environ={}), registry)
    result = train(config, registry, pm)
    with open(result.run_dir / "metrics.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("charts/episodic_return")]
    return result, rows


def check_team_returns(rows: list[dict[str, str]]) -> None:
    assert rows
    for row in rows:
        team = float(row["charts/episodic_return"])
        agents = [float(row[f"charts/return/agent_{i}"]) for i in range(3)]
        assert team == pytest.approx(sum(agents), rel=1e-6, abs=1e-6)
        assert team < 0.0  # simple_spread rewards are negative distances


@pytest.mark.parametrize(
    "extra",
    [["num_envs=4"], ["num_envs=2", "actors=2"]],
    ids=["serial", "farm"],
)
def test_random_policy_trains_on_simple_spread(tmp_path: Path, extra: list[str]) -> None:
    """400 steps of 25-step episodes: 16 episodes, with the per-agent returns beside the
    team's in metrics.csv (serially, and over 2 actor processes)."""
    result, rows = train_random(tmp_path, extra)
    assert result.steps == 400
    assert result.episodes == 16
    check_team_returns(rows)
    assert np.isfinite(result.final_eval)


def test_single_agent_algorithm_is_refused(tmp_path: Path) -> None:
    with pytest.raises(IncompatibleError, match=r"'ppo' is single-agent.*simple_spread_v3"):
        train_random(tmp_path, [], algo="ppo")


# ------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("env_id", "options", "error", "match"),
    [
        ("mpe2/simple_sprad_v3", {}, ConfigError, "Did you mean 'simple_spread_v3'"),
        ("mpe2/simple_reference_v3", {"N": 4}, ConfigError, r"option 'N' is not an argument"),
        (SPREAD, {"kwargs": {"colour": 1}}, ConfigError, r"option 'colour'.*Its arguments: N,"),
        ("pettingzoo:no_such_module_xyz", {}, ConfigError, "cannot import module"),
        ("pettingzoo:toy_marl_aec", {}, ConfigError, r"has no parallel_env.*api = 'aec'"),
        ("pettingzoo:toy_marl:nope", {}, ConfigError, "has no function 'nope'"),
        ("pettingzoo:toy_marl:odd_spaces", {}, IncompatibleError, r"agent 'b' is MultiDisc"),
    ],
)
def test_clear_errors(
    toy: str, env_id: str, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        make_env(env_id, num_envs=1, options=PettingZooConfig(**options))


def test_bad_option_is_a_config_error_naming_it(registry: Any) -> None:
    raw = layer(None, [], [f"env='{SPREAD}'", "algo='random'", "env.api='turns'"], environ={})
    with pytest.raises(ConfigError, match=r"api = 'turns' must be one of 'parallel', 'aec'"):
        resolve(raw, registry)


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpe2", None)  # what find_spec sees without mpe2
    with pytest.raises(PluginError, match=r"pip install 'harness\[multiagent\]'"):
        make_env(SPREAD, num_envs=1)
