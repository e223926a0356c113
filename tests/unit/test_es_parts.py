"""Evolution strategies (plugins/harness_algos/es.py): the shared noise table is the same in
every process, rank shaping is centred, the antithetic estimate follows the true gradient of a
quadratic, perturbations come in antithetic pairs, only whole current-generation episodes
count, the pending generation survives save/restore, and a farm actor's policy made without an
agent draws the perturbations an actor's agent draws, across a new generation."""

from __future__ import annotations

import hashlib
import pickle
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.api import EnvInfo, SpaceInfo, Transition
from harness.policy import Acting
from harness_algos import es

SIZE = (1 << 20) + 3  # odd: the Box-Muller tail is covered too
INFO = EnvInfo(
    "es-test",
    SpaceInfo("box", (4,), "float32", low=(-5.0,) * 4, high=(5.0,) * 4),
    SpaceInfo("discrete", (), "int64", n=2),
    num_envs=4,
)


class PickleBackend:
    """All of a backend ES touches: checkpoint files (its policy is numpy)."""

    name = "pickle"
    device = "cpu"

    def save(self, payload: Mapping[str, Any], path: Path) -> None:
        path.write_bytes(pickle.dumps(dict(payload)))

    def load(self, path: Path) -> dict[str, Any]:
        loaded: dict[str, Any] = pickle.loads(path.read_bytes())
        return loaded

    def rng_state(self) -> None:
        return None

    def set_rng_state(self, state: None) -> None:
        pass


def make(num_envs: int = 4, seed: int = 0, **options: Any) -> es.ESAgent:
    config = es.ESConfig(**{"noise_size": SIZE, "population": 4, "hidden": [8], **options})
    info = EnvInfo(INFO.env_id, INFO.observation, INFO.action, num_envs)
    return es.make_agent(info, PickleBackend(), config, seed=seed)  # type: ignore[arg-type]


def digest(table: np.ndarray) -> str:
    return hashlib.sha256(table.tobytes()).hexdigest()


def test_noise_table_is_identical_in_another_process() -> None:
    here = es.noise_table(7, SIZE)
    code = (
        "import hashlib; from harness_algos import es; "
        f"print(hashlib.sha256(es.noise_table(7, {SIZE}).tobytes()).hexdigest())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == digest(here)


def test_noise_table_is_cached_read_only_and_standard_normal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = es.noise_table(7, SIZE)
    assert es.noise_table(7, SIZE) is table  # built once per process
    monkeypatch.setattr(es, "_TABLES", {})
    again = es.noise_table(7, SIZE)  # an independent construction
    assert again is not table and digest(again) == digest(table)
    assert table.dtype == np.float32 and not table.flags.writeable
    assert abs(float(table.mean())) < 0.01 and abs(float(table.std()) - 1.0) < 0.01
    assert digest(es.noise_table(8, SIZE)) != digest(table)


def test_centered_ranks() -> None:
    x = np.array([3.0, -1.0, 10.0, 2.0, 7.0])
    r = es.centered_ranks(x)
    assert r.min() == -0.5 and r.max() == 0.5 and abs(float(r.sum())) < 1e-6
    assert np.array_equal(np.argsort(r), np.argsort(x))  # monotone
    rng = np.random.default_rng(0)
    r = es.centered_ranks(rng.normal(size=101) * 1e6)
    assert r.min() == -0.5 and r.max() == 0.5 and abs(float(r.mean())) < 1e-6
    ties = es.centered_ranks(np.array([5.0, 1.0, 5.0, 5.0]))
    assert ties[0] == ties[2] == ties[3] > ties[1]  # equal returns, equal weight
    assert np.all(es.centered_ranks(np.full(6, 500.0)) == 0.0)  # no gradient from ties


@pytest.mark.parametrize("rank_shaping", [True, False])
def test_gradient_estimate_points_along_the_true_gradient(rank_shaping: bool) -> None:
    rng = np.random.default_rng(1)
    dim, pairs, sigma = 20, 2000, 0.1
    theta, target = rng.normal(size=dim), rng.normal(size=dim)

    def f(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = -np.sum((x - target) ** 2, axis=-1)
        return out

    eps = rng.standard_normal((pairs, dim)).astype(np.float32)
    grad = es.es_gradient(
        eps, f(theta + sigma * eps), f(theta - sigma * eps), sigma, rank_shaping=rank_shaping
    )
    true = 2 * (target - theta)
    cosine = float(grad @ true / (np.linalg.norm(grad) * np.linalg.norm(true)))
    assert cosine > 0.9, f"cosine {cosine:.3f}"
    if not rank_shaping:  # unbiased: the right length too
        assert np.linalg.norm(grad) == pytest.approx(np.linalg.norm(true), rel=0.15)


def test_updates_climb_a_quadratic() -> None:
    """ES.learn's whole update (noise-table rows, shaping, Adam ascent) on f = -|theta - t|^2."""
    agent = make(population=40, sigma=0.05, learning_rate=0.05, l2_coeff=0.0)
    alg, rng = agent.algorithm, np.random.default_rng(2)
    target = rng.normal(size=alg.dim).astype(np.float32)
    start = float(np.linalg.norm(alg.theta - target))
    for _ in range(150):
        idx = rng.integers(0, SIZE - alg.dim, size=20)
        plus = alg.perturbed(idx, np.ones(20, np.int64))
        minus = alg.perturbed(idx, -np.ones(20, np.int64))
        returns = -np.stack([((plus - target) ** 2).sum(1), ((minus - target) ** 2).sum(1)], 1)
        alg.learn(es.ESBatch(idx, returns, np.ones((20, 2), np.int64)))
    assert alg.generation == 150
    assert float(np.linalg.norm(alg.theta - target)) < 0.2 * start


def test_perturbations_come_in_antithetic_pairs() -> None:
    agent = make(num_envs=4)
    obs = np.zeros((4, 4), np.float32)
    _, x = agent.sample(obs)
    assert list(x["es_sign"]) == [1, -1, 1, -1]
    assert x["es_index"][0] == x["es_index"][1] != x["es_index"][2] == x["es_index"][3]
    assert all(v.dtype.kind == "i" for v in x.values())  # offsets cross the wire, not vectors
    # each slot acts with theta +- sigma * table[index : index + dim]
    alg = agent.algorithm
    rows = alg.noise[x["es_index"][:, None] + np.arange(alg.dim)]
    expected = alg.theta + alg.config.sigma * x["es_sign"][:, None] * rows
    assert np.allclose(alg.perturbed(x["es_index"], x["es_sign"]), expected)
    # slots 0 and 2 end: the next pair is handed out in slot order
    agent.episodes_ended(np.array([True, False, True, False]))
    _, y = agent.sample(obs)
    assert y["es_index"][0] == y["es_index"][2] not in set(x["es_index"])
    assert (y["es_sign"][0], y["es_sign"][2]) == (1, -1)
    assert list(y["es_step"]) == [0, 1, 0, 1]
    # an unpaired + (slot 1 ends alone) is completed by the next slot that needs one
    agent.episodes_ended(np.array([False, True, False, False]))
    agent.episodes_ended(np.array([False, False, False, True]))
    _, z = agent.sample(obs)
    assert z["es_index"][1] == z["es_index"][3] and (z["es_sign"][1], z["es_sign"][3]) == (1, -1)


def test_actors_with_their_own_rng_draw_different_perturbations() -> None:
    """A farm actor's agent is built with the run's seed, then given its own rng: the first
    perturbations are drawn at the first sample, from that rng."""
    a, b = make(seed=1), make(seed=1)
    a.rng, b.rng = np.random.default_rng([1, 0]), np.random.default_rng([1, 1])
    obs = np.zeros((4, 4), np.float32)
    assert not set(a.sample(obs)[1]["es_index"]) & set(b.sample(obs)[1]["es_index"])


def step(
    agent: es.ESAgent, learner: es.ESAgent, done: list[bool], reward: Any = 1.0
) -> dict[str, np.ndarray]:
    """One vector step: ``agent`` acts, ``learner`` observes (the same agent when serial)."""
    n = len(done)
    obs = np.zeros((n, 4), np.float32)
    actions, extras = agent.sample(obs)
    mask = np.array(done)
    rewards = np.broadcast_to(np.asarray(reward, np.float64), (n,))
    learner.observe(Transition(obs, actions, rewards, obs, mask, np.zeros(n, bool), extras))
    if mask.any():
        agent.episodes_ended(mask)
    return extras


def test_learner_counts_whole_current_generation_episodes_only() -> None:
    actor, learner = make(num_envs=2), make(num_envs=2)
    actor.set_weights(learner.weights())
    # a pair of 3-step episodes, rewards 1 and 2 per step
    for t in range(3):
        step(actor, learner, [t == 2, t == 2], reward=[1.0, 2.0])
    assert [row.tolist() for row in learner.results.values()] == [[3.0, 6.0, 3.0, 3.0]]
    assert learner.learn()["es/pending_pairs"] == 1.0  # population 4: two pairs needed
    assert learner.algorithm.generation == 0
    # the second pair (2 and 4 steps); slot 0's next episode begins before the update
    step(actor, learner, [False, False])
    step(actor, learner, [True, False])
    step(actor, learner, [False, False])
    step(actor, learner, [False, True])
    before = actor.weights()["theta"]
    metrics = learner.learn()
    assert learner.algorithm.generation == 1 and metrics["es/pairs"] == 2.0
    assert not np.array_equal(learner.weights()["theta"], before)
    assert learner.results == {}
    actor.set_weights(learner.weights())  # the next rollout: slot 0's episode is in flight
    extras = step(actor, learner, [True, False])
    assert extras["es_generation"][0] == 0  # tagged with the generation it began in
    assert learner.results == {} and learner.dropped == 1  # so the learner dropped it
    step(actor, learner, [True, True])  # slot 0: a generation-1 episode; slot 1: stale
    assert len(learner.results) == 1 and learner.dropped == 2
    step(actor, learner, [True, False])  # slot 0 completes the generation-1 pair
    rows = list(learner.results.values())
    assert len(rows) == 1 and not np.isnan(rows[0]).any() and learner.dropped == 2


def test_an_episode_whose_start_was_not_observed_is_dropped() -> None:
    """A lost rollout (or a resume) leaves the learner mid-episode: that result is dropped."""
    actor, learner = make(num_envs=1), make(num_envs=1)
    step(actor, learner, [False])
    actor.sample(np.zeros((1, 4), np.float32))  # a step the learner never receives
    step(actor, learner, [True])
    assert learner.results == {} and learner.dropped == 1
    step(actor, learner, [False])
    step(actor, learner, [True])
    assert len(learner.results) == 1 and learner.dropped == 1


def test_serial_generations_and_save_restore(tmp_path: Path) -> None:
    agent = make(num_envs=2, seed=3)
    rng = np.random.default_rng(0)
    for t in range(200):
        step(agent, agent, list(rng.random(2) < 0.2), reward=float(rng.normal()))
        if t % 10 == 9:
            agent.learn()
    assert agent.algorithm.generation > 3
    # mid-generation: a pending result and a half-used pair
    for _ in range(100):
        if agent.results and agent.stream.partners:
            break
        step(agent, agent, list(rng.random(2) < 0.3), reward=float(rng.normal()))
    assert agent.results and agent.stream.partners
    agent.save(tmp_path)
    restored = make(num_envs=2, seed=99)
    restored.restore(tmp_path)
    assert restored.algorithm.generation == agent.algorithm.generation
    assert restored.stream.partners == agent.stream.partners
    assert restored.results.keys() == agent.results.keys()
    for key, row in agent.results.items():
        assert np.array_equal(restored.results[key], row, equal_nan=True)
    assert np.array_equal(restored.algorithm.moment2, agent.algorithm.moment2)
    obs = rng.normal(size=(2, 4)).astype(np.float32)
    # a resumed run's envs start fresh episodes (the stepper's initial state): the restored
    # agent draws their perturbations as the saved one would, the waiting - member first
    waiting = agent.stream.partners[0]
    mine, theirs = fresh_episodes(agent, obs), fresh_episodes(restored, obs)
    assert np.array_equal(theirs[0], mine[0])
    for key, value in mine[1].items():
        assert np.array_equal(theirs[1][key], value), key
    assert (theirs[1]["es_index"][0], theirs[1]["es_sign"][0]) == (waiting, -1)
    # right after an update every slot's episode is stale; a resumed run resets its envs, so
    # the restored slots start episodes that count for the current generation
    for _ in range(200):
        step(agent, agent, list(rng.random(2) < 0.2), reward=float(rng.normal()))
        if agent.learn()["es/pending_pairs"] == 0.0:  # (an update)
            break
    assert np.all(agent.sample(obs)[1]["es_generation"] < agent.algorithm.generation)
    agent.save(tmp_path / "after-update")
    restored.restore(tmp_path / "after-update")
    extras = fresh_episodes(restored, obs)[1]
    assert np.all(extras["es_generation"] == restored.algorithm.generation)
    assert np.all(extras["es_step"] == 0)


def fresh_episodes(agent: es.ESAgent, obs: np.ndarray) -> tuple[Any, dict[str, np.ndarray]]:
    """The exploratory actions and extras of ``agent``'s policy for envs starting fresh
    episodes (its initial state, as a resumed run's stepper starts)."""
    policy = agent.policy()
    actions, extras, _ = policy.act(obs, policy.initial_state(len(obs)), explore=True)
    return actions, extras


def test_a_policy_without_an_agent_draws_as_an_actors_agent_across_generations() -> None:
    """A farm actor without an agent (``es.make_policy`` over an ``Acting`` of ``ES`` alone,
    as ``AlgorithmSpec.make_algorithm`` builds it) hands out the perturbations an actor's
    agent hands out from the same generator, and a broadcast of a new generation forgets the
    half-used antithetic pair in both: the next episode starts a new pair, not the old + 's
    partner (whose + member ran under the old theta)."""
    learner, agent = make(num_envs=3, seed=1), make(num_envs=3, seed=5)
    info, config = agent.env_info, agent.config
    backend: Any = PickleBackend()  # (all of a backend ES touches)
    acting = Acting(es.ES(backend, info, config), info, config, np.random.default_rng(7))
    agent.rng = np.random.default_rng(7)
    policies = [es.make_policy(acting), agent.policy()]
    for policy in policies:
        policy.load(learner.weights(), 0)
    obs = np.zeros((3, 4), np.float32)
    drawn = [policy.act(obs, policy.initial_state(3), explore=True) for policy in policies]
    for key, value in drawn[1][1].items():
        assert np.array_equal(drawn[0][1][key], value), key
    assert list(drawn[0][1]["es_sign"]) == [1, -1, 1]  # the third row's pair is half-used
    assert acting.algorithm.stream.partners == agent.stream.partners != []
    newer = {**learner.weights(), "generation": np.array(1, np.int64)}
    ended = np.array([True, False, False])
    states = []
    for policy, (_, _, state) in zip(policies, drawn, strict=True):
        policy.load(newer, 1)
        states.append(policy.reset(state, ended, explore=True))
    assert (
        acting.algorithm.stream.partners == agent.stream.partners == [int(states[0]["es_index"][0])]
    )
    for key, value in states[1].items():
        assert np.array_equal(states[0][key], value), key
    assert states[0]["es_sign"][0] == 1 and states[0]["es_generation"][0] == 1
    assert states[0]["es_index"][0] != drawn[0][1]["es_index"][2]
