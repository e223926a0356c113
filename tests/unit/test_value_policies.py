"""The native policies of the value-based and ES families (issue 49): R2D2's recurrent state,
QMIX's GRU state and last actions, ES's perturbation per episode are state rows the caller
keeps, so exploring acting for any rows with their state rows gives those rows' actions,
extras and next state (what lets a policy server act for any envs together), acting never
writes into the state it was given, and checkpoints hold no acting state while those of
earlier versions, which did, still load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.api import EnvInfo, SpaceInfo, Transition, tree_map
from harness.plugins import collect_registry, make_plugin_manager
from harness.pytest_plugin import cpu_backend

ENVS = 6
ROWS = np.array([1, 4, 5])  # a subset of the envs, as a policy server's batch may be
SINGLE = EnvInfo(
    "unit",
    SpaceInfo("box", (3,), "float32"),
    SpaceInfo("discrete", (), "int64", n=3),
    num_envs=ENVS,
)
OBS = {"a": SpaceInfo("box", (4,), "float32"), "b": SpaceInfo("box", (6,), "float32")}
MULTI = EnvInfo(
    "unit-multi",
    OBS["a"],
    SpaceInfo("discrete", (), "int64", n=4),
    num_envs=ENVS,
    agents=tuple(OBS),
    observations=OBS,
    actions=dict.fromkeys(OBS, SpaceInfo("discrete", (), "int64", n=4)),
)
OLD_ACTING_KEYS = {
    "r2d2": {"acting/state": (ENVS, 16)},  # (LSTM of 8 units: h and c)
    "qmix": {"acting/hidden": (ENVS, 2, 8), "acting/last_actions": (ENVS, 2)},
    "es": {"index": (ENVS,), "sign": (ENVS,), "born": (ENVS,)},
}
"""What each agent's data state held of its acting state before its policy kept it."""
FLOAT_KEYS = ("acting/state", "acting/hidden")


@pytest.fixture(scope="module")
def torch_backend() -> Any:
    pytest.importorskip("torch")
    return cpu_backend(collect_registry(make_plugin_manager()), "torch")


def make(name: str, backend: Any, seed: int = 0, *, greedy: bool = False) -> Any:
    """A small agent; ``greedy``: exploring acting with epsilon 0 (deterministic)."""
    from harness_algos import es, qmix, r2d2

    eps = 0.0 if greedy else 1.0
    if name == "r2d2":
        config: Any = r2d2.R2D2Config(
            rnn_hidden=8,
            hidden=[8],
            head_hidden=[8],
            seq_len=4,
            burn_in=1,
            overlap=2,
            batch_size=4,
            buffer_size=16,
            learning_starts=0,
            exploration_initial_eps=eps,
            exploration_final_eps=min(eps, 0.5),
        )
        return r2d2.make_agent(SINGLE, backend, config, seed=seed, total_steps=100)
    if name == "qmix":
        config = qmix.QMIXConfig(
            hidden=8,
            recurrent=True,
            last_action=True,
            batch_size=4,
            buffer_size=16,
            seq_len=4,
            learning_starts=4,
            epsilon_start=eps,
            epsilon_end=min(eps, 0.5),
        )
        return qmix.make_agent(MULTI, backend, config, seed=seed, total_steps=100)
    config = es.ESConfig(population=4, hidden=[8], noise_size=10_000, n_steps=4)
    return es.make_agent(SINGLE, backend, config, seed=seed, total_steps=100)


def observations(info: EnvInfo, rng: np.random.Generator) -> Any:
    if info.multi_agent:
        return {a: rng.standard_normal((ENVS, *OBS[a].shape)) for a in info.agents}
    return rng.standard_normal((ENVS, 3)).astype(np.float32)


def explore(policy: Any, batches: list[Any], state: dict[str, np.ndarray]) -> list[Any]:
    """Exploratory acting over consecutive batches from ``state``: each step's actions,
    extras and next state; checks that no step wrote into the state it was given."""
    steps = []
    for obs in batches:
        given = state
        kept = {key: np.array(value, copy=True) for key, value in given.items()}
        actions, extras, state = policy.act(obs, given, explore=True)
        for key, value in kept.items():
            np.testing.assert_array_equal(given[key], value, err_msg=f"{key} changed in place")
        steps.append((actions, extras, state))
    return steps


@pytest.mark.parametrize("name", ["r2d2", "qmix", "es"])
def test_exploring_for_some_rows_gives_those_rows_of_acting_for_all(
    name: str, torch_backend: Any
) -> None:
    agent = make(name, torch_backend, greedy=True)
    policy = agent.policy()
    rng = np.random.default_rng(3)
    batches = [observations(agent.env_info, rng) for _ in range(3)]
    # every row mid-episode (ES: its perturbation drawn; a fresh row would draw in order)
    state = policy.reset(policy.initial_state(ENVS), np.ones(ENVS, bool), explore=True)
    state = explore(policy, batches[:1], state)[-1][2]
    assert state, f"{name} keeps per-env state"
    full = explore(policy, batches[1:], state)
    rows = explore(
        policy,
        [tree_map(lambda x: x[ROWS], obs) for obs in batches[1:]],
        {key: value[ROWS] for key, value in state.items()},
    )
    for t, (whole, some) in enumerate(zip(full, rows, strict=True)):
        for part, (want, got) in enumerate(zip(whole, some, strict=True)):
            for key, value in (want if isinstance(want, dict) else {"": want}).items():
                mine = got[key] if isinstance(got, dict) else got
                np.testing.assert_allclose(
                    mine, np.asarray(value)[ROWS], rtol=1e-6, atol=1e-6, err_msg=f"{t} {part} {key}"
                )


@pytest.mark.parametrize("name", ["r2d2", "qmix", "es"])
def test_checkpoints_hold_no_acting_state_and_older_ones_still_load(
    name: str, torch_backend: Any, tmp_path: Path
) -> None:
    """A resumed run's envs start fresh episodes from the policy's initial state, so the
    agent's data state keeps the learner's side only (replay, sequences being written, ES
    results); a checkpoint that still holds the acting state loads, ignoring it."""
    agent = make(name, torch_backend)
    rng = np.random.default_rng(1)
    obs = observations(agent.env_info, rng)
    for t in range(9):
        actions, extras = agent.sample(obs)
        following = observations(agent.env_info, rng)
        done = np.arange(ENVS) == t % ENVS
        rewards: Any = rng.standard_normal(ENVS)
        if agent.env_info.multi_agent:
            rewards = dict.fromkeys(agent.env_info.agents, rewards)
        agent.observe(Transition(obs, actions, rewards, following, done, ~done & False, extras))
        agent.episodes_ended(done)
        obs = following
    agent.save(tmp_path / "ck")
    with np.load(tmp_path / "ck" / "data.npz", allow_pickle=False) as data:
        saved = dict(data)
    assert saved and not set(saved) & set(OLD_ACTING_KEYS[name])
    assert not [key for key in saved if key.startswith("acting/")]
    old = saved | {
        key: np.ones(shape, np.float32 if key in FLOAT_KEYS else np.int64)
        for key, shape in OLD_ACTING_KEYS[name].items()
    }
    np.savez(tmp_path / "ck" / "data.npz", **old)  # type: ignore[arg-type]
    restored = make(name, torch_backend, seed=7)
    restored.restore(tmp_path / "ck")
    again = restored.data_state()
    assert again.keys() == saved.keys()
    for key, value in saved.items():
        np.testing.assert_array_equal(np.asarray(again[key]), value, err_msg=key)
