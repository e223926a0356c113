"""Central (batched) inference for the farm (``run.inference = "central"``): real shared
memory, real FIFOs, a real policy-server thread, real actor processes on an embedded ZeroMQ
farm.

- The server answers exactly what the agent's own ``sample`` gives for the same
  observations, weights and generator (torch and paddle), and never mixes up the rows of
  actors served in one batch.
- PPO and IMPALA on CartPole reach the learning threshold with central inference over 2
  actors; PPO's rollouts are acted by the newest weights throughout.
- Exactly once: actors killed every few seconds, and a policy server that fails mid-run, are
  replaced; every transition the learner received was observed once.
- Bad configs fail at start-up naming the key and the fix. Policies with per-env state rows
  are served by row: ES's perturbations and R2D2's recurrent states here, recurrent PPO and
  IMPALA in tests/distributed/test_central_recurrent.py (an agent written before ``Policy``
  that keeps state it cannot keep by row is refused: tests/unit/test_acting_plan.py).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_farm import Killer, Periodic, run_farm  # same directory: pytest puts it on sys.path

from harness import hookimpl
from harness.config import find_pack_file, layer, resolve
from harness.errors import ConfigError
from harness.plugins import collect_registry, make_plugin_manager
from harness.policy import Acting
from harness.runtime import env_info, make_agent, make_envs
from harness.runtime.acting import AUTO_MIN_ACTORS, choose_central, plan_acting
from harness.runtime.inference import CentralActing, PolicyServer, batch_rows
from harness_algos.dqn import epsilon_at

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]
PACK = find_pack_file(ROOT / "competitions" / "cartpole")
IMPALA = ROOT / "competitions" / "cartpole" / "impala.toml"
ES = ROOT / "competitions" / "cartpole" / "es.toml"
DQN = ROOT / "competitions" / "cartpole" / "dqn.toml"
R2D2 = ROOT / "competitions" / "cartpole" / "r2d2.toml"
MASKED_PPO = ROOT / "competitions" / "cartpole" / "masked_ppo.toml"


# ------------------------------------------------------------------------------------------
# the server answers what the agent samples


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(-1, keepdims=True)
    return np.asarray(z - np.log(np.exp(z).sum(-1, keepdims=True)))


def assert_acts_as(learner: Any, actors: list[Any], steps: int, rows: tuple[slice, ...]) -> None:
    """Actor ``i`` (a stand-in for the policy server) answers ``rows[i]`` of each of ``steps``
    random observation batches with exactly what ``learner.sample`` gives for them, drawing
    from the generator the server's agent was given (``default_rng(5)``), in the same order."""
    learner.rng = np.random.default_rng(5)  # the reference draws from the same stream
    width = max(r.stop for r in rows)
    data = np.random.default_rng(0).standard_normal((steps, width, 4)).astype(np.float32)
    for obs in data:
        for actor, part in zip(actors, rows, strict=True):
            got_actions, got_extras = actor.sample(obs[part])
            want_actions, want_extras = learner.sample(obs[part])
            np.testing.assert_array_equal(got_actions, want_actions)
            assert sorted(got_extras) == sorted(want_extras)
            for key, value in want_extras.items():
                np.testing.assert_allclose(got_extras[key], value, rtol=1e-6, atol=1e-7)


def served_by_rows(config: Any, agent: Any) -> bool:
    """Whether the plan of a central farm of ``config`` keeps ``agent``'s acting state by row
    (what the farm gives its policy server)."""
    run = dataclasses.replace(config.run, actors=2, inference="central")
    return plan_acting(dataclasses.replace(config, run=run), agent).by_rows


@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_central_answers_what_the_agent_samples(algo: str, harness_backend_name: str) -> None:
    files = [IMPALA] if algo == "impala" else []
    registry = collect_registry(make_plugin_manager())
    config = resolve(
        layer(PACK, files, [f"backend='{harness_backend_name}'", "num_envs=8"], environ={}),
        registry,
    )
    envs = make_envs(config, registry, 1, seed=None)
    info = dataclasses.replace(env_info(config.run.env, envs), num_envs=8)
    envs.close()
    learner = make_agent(config, registry, info)

    def acting() -> Any:
        agent = make_agent(config, registry, info)  # other initial weights until published
        agent.rng = np.random.default_rng(5)
        return agent

    server = PolicyServer(acting, [3, 5], by_rows=served_by_rows(config, learner))
    actors: list[CentralActing] = []
    try:
        server.publish(7, learner.weights(), 1234)
        actors = [CentralActing(server.link, i) for i in range(2)]
        # one actor at a time: each batch is that actor's rows, in the reference's order
        assert_acts_as(learner, actors, steps=6, rows=(slice(0, 3), slice(3, 8)))
        assert [a.oldest_version for a in actors] == [7, 7]
        # schedules read the learner's count with the weights acting, never moved by a batch
        assert server.parts.env_steps == 1234

        # both actors at once, in whatever batches the server forms: every row's log-prob is
        # its own observation's under the published weights
        def act(actor: CentralActing, width: int, seed: int, out: list[Any]) -> None:
            rng = np.random.default_rng(seed)
            for _ in range(40):
                obs = rng.standard_normal((width, 4)).astype(np.float32)
                out.append((obs, *actor.sample(obs)))

        results: list[list[Any]] = [[], []]
        threads = [
            threading.Thread(target=act, args=(actors[i], w, 10 + i, results[i]))
            for i, w in enumerate((3, 5))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert all(len(r) == 40 for r in results)
        for obs, actions, extras in results[0] + results[1]:
            logits = learner.algorithm.policy_outputs(obs)[0][0]
            want = np.take_along_axis(_log_softmax(logits), actions[:, None], -1)[:, 0]
            np.testing.assert_allclose(extras["log_prob"], want, rtol=1e-5, atol=1e-5)
        assert server.stats()["farm/inference_batch"] >= 3.0
    finally:
        for actor in actors:
            actor.close()
        server.close()
    assert not Path(server.link.directory).exists(), "the shared arrays were left behind"


def test_batch_rows_match_the_rows_of_each_actor_in_order() -> None:
    """The vectorised gather of a batch's rows (a faster copy of concatenating each actor's
    range) gives the same rows for every subset of actors of uneven widths; neighbours give
    a slice (a view of the shared array, no copy)."""
    offsets = np.concatenate([[0], np.cumsum([3, 1, 2, 4, 1])]).astype(np.int64)
    for mask in range(1, 2**5):
        ids = np.flatnonzero([(mask >> i) & 1 for i in range(5)])
        want = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in ids])
        got = batch_rows(offsets, ids)
        if isinstance(got, slice):
            assert np.array_equal(np.diff(ids), np.ones(len(ids) - 1)), ids
            got = np.arange(got.start, got.stop)
        np.testing.assert_array_equal(got, want, err_msg=str(ids))


def test_actors_of_uneven_widths_get_their_own_rows_in_any_batch() -> None:
    """Three actors (2, 1 and 3 envs) acting at once: whichever of them the server batches
    together (neighbours or not), every row's answer is its own observation's."""
    registry = collect_registry(make_plugin_manager())
    config = resolve(layer(PACK, [], ["num_envs=6"], environ={}), registry)
    envs = make_envs(config, registry, 1, seed=None)
    info = dataclasses.replace(env_info(config.run.env, envs), num_envs=6)
    envs.close()
    learner = make_agent(config, registry, info)
    widths = (2, 1, 3)
    server = PolicyServer(
        lambda: make_agent(config, registry, info),
        list(widths),
        by_rows=served_by_rows(config, learner),
    )
    actors: list[CentralActing] = []
    try:
        server.publish(1, learner.weights(), 0)
        actors = [CentralActing(server.link, i) for i in range(3)]
        results: list[list[Any]] = [[], [], []]
        rng = np.random.default_rng(9)
        obs = [rng.standard_normal((w, 4)).astype(np.float32) for w in widths]
        server.stats()
        with server._lock:  # the server takes actor 1's request and waits for the weights
            actors[1].submit(obs[1])
            time.sleep(0.2)
            actors[0].submit(obs[0])  # these two wait in the FIFO: one batch, not neighbours
            actors[2].submit(obs[2])
        for i in (1, 0, 2):
            results[i].append((obs[i], *actors[i].receive()))
        stats = server.stats()
        assert (stats["farm/inference_batch"], stats["farm/inference_batches_per_s"] > 0) == (
            3.0,
            True,
        ), f"actors 0 and 2 were not served in one batch: {stats}"

        def act(i: int) -> None:
            rng = np.random.default_rng(i)
            for _ in range(60):
                obs = rng.standard_normal((widths[i], 4)).astype(np.float32)
                results[i].append((obs, *actors[i].sample(obs)))

        threads = [threading.Thread(target=act, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert [len(r) for r in results] == [61, 61, 61]
        for obs, actions, extras in results[0] + results[1] + results[2]:
            assert actions.shape == (len(obs),)
            logits = learner.algorithm.policy_outputs(obs)[0][0]
            want = np.take_along_axis(_log_softmax(logits), actions[:, None], -1)[:, 0]
            np.testing.assert_allclose(extras["log_prob"], want, rtol=1e-5, atol=1e-5)
        stats = server.stats()
        assert stats["farm/inference_cpu"] > 0.0, "the server thread's CPU was not counted"
    finally:
        for actor in actors:
            actor.close()
        server.close()


def test_a_gathering_window_batches_late_requests_and_ends_when_all_are_in() -> None:
    """``run.inference_wait_ms``: a request that arrives within the window joins the first
    one's batch; once every actor's request is in, the batch runs without waiting out the
    window (30 s here: a server that waited it out would fail the bound below)."""
    registry = collect_registry(make_plugin_manager())
    config = resolve(layer(PACK, [], ["num_envs=3"], environ={}), registry)
    envs = make_envs(config, registry, 1, seed=None)
    info = dataclasses.replace(env_info(config.run.env, envs), num_envs=3)
    envs.close()
    agent = make_agent(config, registry, info)
    server = PolicyServer(
        lambda: make_agent(config, registry, info),
        [1, 2],
        by_rows=served_by_rows(config, agent),
        wait_s=30.0,
    )
    actors: list[CentralActing] = []
    try:
        actors = [CentralActing(server.link, i) for i in range(2)]
        for actor, width in zip(actors, (1, 2), strict=True):  # the server is up and reading
            actor.submit(np.zeros((width, 4), np.float32))
        for actor in actors:
            actor.receive()
        server.stats()
        start = time.monotonic()
        actors[1].submit(np.zeros((2, 4), np.float32))
        time.sleep(0.3)  # well inside the window
        actors[0].submit(np.ones((1, 4), np.float32))
        widths = [len(actor.receive()[0]) for actor in actors]
        elapsed = time.monotonic() - start
        stats = server.stats()
        assert widths == [1, 2]
        assert stats["farm/inference_batch"] == 3.0, stats  # one batch of all three rows
        assert elapsed < 15.0, f"the server waited out its window ({elapsed:.1f} s)"
    finally:
        for actor in actors:
            actor.close()
        server.close()


# ------------------------------------------------------------------------------------------
# learning


def test_ppo_on_two_actors_with_central_inference_solves_cartpole(tmp_path: Path) -> None:
    result, rec = run_farm(tmp_path, ["actors=2", "num_envs=8", "seed=1", "inference='central'"])
    assert rec.central, "the farm did not act centrally"
    assert result.best_eval >= 475.0, f"PPO, central inference: best eval {result.best_eval:.1f}"
    farm = [m for m in rec.metrics if "farm/policy_lag" in m]
    assert max(m["farm/policy_lag_max"] for m in farm) == 0.0, "PPO learned from stale weights"
    assert farm[-1]["farm/received_steps"] == rec.final_step == rec.env_steps
    assert all(m["farm/inference_batches_per_s"] > 0 for m in farm), "the server acted for none"


@pytest.mark.slow
def test_impala_on_two_actors_with_central_inference_solves_cartpole(tmp_path: Path) -> None:
    from harness.checkpoint import latest_checkpoint
    from harness.runtime import evaluate, load_agent

    result, rec = run_farm(tmp_path, ["actors=2", "seed=1", "inference='central'"], files=(IMPALA,))
    assert rec.central
    registry = collect_registry(make_plugin_manager())
    config = resolve(
        layer(PACK, [IMPALA], [f"out='{tmp_path}'", "inference='central'"], environ={}),
        registry,
    )
    agent = load_agent(config, registry, latest_checkpoint(result.run_dir))
    fresh = evaluate(agent, config, registry, 20, seed=777_001)
    assert fresh.mean >= 475.0, f"IMPALA, central inference: fresh 20-episode mean {fresh.mean}"
    farm = [m for m in rec.metrics if "farm/policy_lag" in m]
    assert max(m["farm/policy_lag_max"] for m in farm) <= 4.0
    assert farm[-1]["farm/received_steps"] == rec.final_step == rec.env_steps


# ------------------------------------------------------------------------------------------
# faults


class ServerFault(Periodic):
    """Makes the policy server's policy raise in the middle of a batch every ``every``
    seconds, at its ``AFTER``-th batch from then (inside a rollout, not between two): the
    server is replaced (a fresh agent) and its actors carry on."""

    AFTER = 5

    @property
    def faults(self) -> int:
        return self.count

    def strike(self, run: Any) -> None:
        server = run.collector.server
        calls = [0]

        def failing(method: Any) -> Any:
            def call(*args: Any) -> Any:
                calls[0] += 1
                if calls[0] >= self.AFTER:
                    raise RuntimeError("policy worker lost (injected)")
                return method(*args)

            return call

        if server.policy is not None:  # (what the server acts through: the agent's policy)
            server.policy.act = failing(server.policy.act)
        else:  # (an agent acting through sample, or sample_rows by row)
            assert server.agent is not None
            server.agent.sample = failing(server.agent.sample)
            server.agent.sample_rows = failing(server.agent.sample_rows)


@pytest.mark.parametrize(
    ("algo", "seconds", "stream"),
    [
        pytest.param("random", 25, True, id="streamed"),
        pytest.param("ppo", 60, False, id="rounds", marks=pytest.mark.slow),
    ],
)
def test_killed_actors_and_a_failed_server_lose_nothing(
    tmp_path: Path, algo: str, seconds: int, stream: bool
) -> None:
    """kill -9 of an actor every 3 s and a policy-server failure every 4 s (Delay env, 5 ms
    a step); the run completes and every transition received was observed exactly once."""
    killer, fault = Killer(every=3.0), ServerFault(every=4.0)
    result, rec = run_farm(
        tmp_path,
        [
            f"algo='{algo}'",
            "env='harness/Delay-v0'",
            "env.kwargs={step_seconds=0.005}",
            "actors=3",
            "num_envs=6",
            "total_steps=10_000_000",
            f"max_seconds={seconds}",
            "max_policy_lag=2",
            "eval_every=0",
            "eval_episodes=2",
            "checkpoint_every=0",
            "inference='central'",
        ],
        plugins=(killer, fault),
    )
    assert rec.central
    farm = [m for m in rec.metrics if "farm/actor_restarts" in m]
    assert result.stopped_early, "the run should end by run.max_seconds"
    assert killer.kills >= 4 and fault.faults >= 3, "the run was too short to test"
    assert result.steps >= 5_000, f"only {result.steps} steps in {seconds} s"
    assert farm[-1]["farm/actor_restarts"] >= killer.kills - 1  # the last kill may be unseen
    assert farm[-1]["farm/inference_restarts"] >= fault.faults - 1
    assert farm[-1]["farm/received_steps"] == rec.final_step == rec.env_steps == result.steps


# ------------------------------------------------------------------------------------------
# bad configs


@pytest.mark.parametrize(
    ("overrides", "files", "match"),
    [
        (["actors=0"], (), r"run\.inference = 'central'.*run\.actors = 0.*--actors 2"),
        (["actors=2", "inference_wait_ms=-1"], (), r"run\.inference_wait_ms = -1.*0 serves"),
    ],
    ids=["no-actors", "negative-wait"],
)
def test_central_inference_that_cannot_work_is_refused_at_start_up(
    tmp_path: Path, overrides: list[str], files: tuple[Path, ...], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        run_farm(tmp_path, [*overrides, "inference='central'"], files=files)
    assert not any(tmp_path.iterdir()), "a refused start left a run directory behind"


@pytest.mark.parametrize("files", [(ES,), (R2D2,)], ids=["es", "r2d2"])
def test_policies_with_state_rows_are_served_by_row(tmp_path: Path, files: tuple[Path]) -> None:
    """ES (each episode's perturbation, drawn at its start) and R2D2 (a recurrent state) act
    through policies whose per-env state is rows: the server keeps them for every env of a
    2-actor farm, and every step it acted is observed once."""
    result, rec = run_farm(
        tmp_path,
        [
            "actors=2",
            "num_envs=4",
            "total_steps=3000",
            "eval_every=0",
            "checkpoint_every=0",
            "stop_at_return=0",
            "inference='central'",
        ],
        files=files,
    )
    assert rec.central
    farm = [m for m in rec.metrics if "farm/received_steps" in m]
    assert farm and farm[-1]["farm/inference_batch"] > 0
    assert farm[-1]["farm/received_steps"] == rec.final_step == rec.env_steps == result.steps


class _ServerSpy:
    """Records, from the first iteration's end, each version the farm publishes to its
    policy server (with the learner's env-step count) and the count and epsilon of each batch
    acted."""

    def __init__(self) -> None:
        self.published: list[int] = []
        self.acted: list[tuple[int, float]] = []
        self.server: Any = None

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Any) -> None:
        if self.server is not None:
            return
        server = self.server = run.collector.server
        self.published.append(server.parts.env_steps)  # (the version acting now)
        publish, act = server.publish, server.policy.act

        def publishing(version: int, weights: Any, env_steps: int) -> None:
            self.published.append(env_steps)
            publish(version, weights, env_steps)

        def acting(obs: Any, state: Any, rng: Any = None, *, explore: bool) -> Any:
            self.acted.append((server.parts.env_steps, float(server.policy.epsilon())))
            return act(obs, state, rng, explore=explore)

        server.publish, server.policy.act = publishing, acting


def test_the_server_acts_without_an_agent_and_moves_epsilon_with_the_weights(
    tmp_path: Path,
) -> None:
    """A central farm's policy server acts as a per-actor actor does where the algorithm
    declares ``make_policy``: the policy made from the algorithm and an ``Acting`` (no agent,
    no replay); its epsilon reads the learner's count published with the weights acting, so
    it moves with the versions, never by a batch."""
    spy = _ServerSpy()
    settings = [
        "actors=2",
        "num_envs=4",
        "total_steps=2000",
        "eval_every=0",
        "checkpoint_every=0",
        "stop_at_return=0",
        "inference='central'",
        "algo.learning_starts=200",
        "algo.train_freq=64",
        "algo.gradient_steps=1",
        "algo.exploration_fraction=0.5",
    ]
    run_farm(tmp_path, settings, files=(DQN,), plugins=(spy,))
    server = spy.server
    assert server.agent is None and isinstance(server.parts, Acting)
    assert not hasattr(server.parts, "replay")
    counts = {count for count, _ in spy.acted}
    assert counts <= set(spy.published), "a batch moved the count between versions"
    assert len(counts) >= 3, f"the weights acting moved too rarely to tell: {sorted(counts)}"
    for count, epsilon in spy.acted:  # one schedule, the learner's count with the weights
        assert epsilon == pytest.approx(
            epsilon_at(Acting(None, None, server.parts.config, None, 2000, count))
        )


class _NoRelayClient:
    """A transport's client that places actors but relays no inference (as a third-party
    transport may be): a real local ZeroMQ farm without ``serve_inference``."""

    def __init__(self) -> None:
        from harness_zmq.client import connect

        self.inner = connect(None)

    def create_actor(self, *args: Any) -> Any:
        return self.inner.create_actor(*args)

    def close(self) -> None:
        self.inner.close()


class _NoRelayTransport:
    @hookimpl
    def harness_register_transports(self) -> list[Any]:
        from harness.registry import TransportSpec

        return [TransportSpec("norelay", lambda address=None, **options: _NoRelayClient())]


def test_remote_actors_on_a_transport_without_a_relay_are_refused(tmp_path: Path) -> None:
    """Remote actors act centrally through the transport's relay (the ZeroMQ one:
    tests/distributed/test_central_remote.py); a transport without one is named."""
    overrides = ["actors=2", "transport='norelay'", "cluster='tcp://127.0.0.1:1'"]
    with pytest.raises(ConfigError, match=r"run\.transport = 'norelay'.*run\.inference = 'actor'"):
        run_farm(tmp_path, [*overrides, "inference='central'"], plugins=(_NoRelayTransport(),))
    assert not any(tmp_path.iterdir()), "a refused start left a run directory behind"


def test_a_misspelled_inference_mode_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"run\.inference = 'centrl'.*Did you mean 'central'"):
        run_farm(tmp_path, ["actors=2", "inference='centrl'"])


def test_a_misspelled_inference_device_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"run\.inference_device = 'gpu'.*\[backend\] device"):
        run_farm(tmp_path, ["actors=2", "inference='central'", "inference_device='gpu'"])
    assert not list(tmp_path.iterdir())  # (refused before a run directory was made)


def test_the_server_acts_on_the_learners_device_unless_told_cpu() -> None:
    """The policy server's config: the learner's backend device in float32, or an actor's.
    (On a GPU machine tests/gpu/test_cuda.py runs the server on CUDA.)"""
    import dataclasses

    from harness.config import Config, RunConfig
    from harness.runtime.farm import server_config
    from harness_torch.config import TorchConfig

    learner = Config(
        run=RunConfig(actors=2, inference="central"),
        algo=None,
        backend=TorchConfig(device="cuda", amp="bf16"),
    )
    on_learner = server_config(learner).backend
    assert (on_learner.device, on_learner.amp) == ("cuda", "off")
    cpu = dataclasses.replace(learner, run=RunConfig(inference="central", inference_device="cpu"))
    on_cpu = server_config(cpu).backend
    assert (on_cpu.device, on_cpu.amp) == ("cpu", "off")


def _auto(files: list[Path], overrides: list[str]) -> tuple[bool, str]:
    registry = collect_registry(make_plugin_manager())
    config = resolve(layer(PACK, files, [*overrides, "inference='auto'"], environ={}), registry)
    envs = make_envs(config, registry, 1, seed=None)
    info = env_info(config.run.env, envs)
    envs.close()
    return choose_central(config, make_agent(config, registry, info))


@pytest.mark.parametrize(
    ("files", "overrides", "central", "why"),
    [
        ([], ["actors=2"], False, "2 actors (<"),
        ([], [f"actors={AUTO_MIN_ACTORS}"], True, f"{AUTO_MIN_ACTORS} actors (>="),
        ([], [f"actors={AUTO_MIN_ACTORS}", "cluster='tcp://127.0.0.1:1'"], False, "remote"),
        ([ES], [f"actors={AUTO_MIN_ACTORS}"], True, f"{AUTO_MIN_ACTORS} actors (>="),
        ([MASKED_PPO], [f"actors={AUTO_MIN_ACTORS}"], True, f"{AUTO_MIN_ACTORS} actors (>="),
        ([IMPALA], ["env='ALE/Pong-v5'", "actors=2"], False, "2 actors (<"),
    ],
    ids=["few", "many", "cluster", "es", "recurrent-many", "cnn-few"],
)
def test_auto_picks_where_each_mode_measured_faster(
    files: list[Path], overrides: list[str], central: bool, why: str
) -> None:
    got, reason = _auto(files, overrides)
    assert (got, why in reason) == (central, True), reason


@pytest.mark.parametrize("backend", ["torch", "paddle"])
def test_a_gpu_asked_for_where_there_is_none_is_refused_at_start_up(
    tmp_path: Path, backend: str
) -> None:
    """The policy server acts on the learner's device: a CUDA device this machine lacks is
    refused before anything starts, naming the key and the fix."""
    if backend == "torch":
        torch = pytest.importorskip("torch")
        if torch.cuda.is_available():
            pytest.skip("torch sees a CUDA device here")
    else:
        paddle = pytest.importorskip("paddle")
        if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
            pytest.skip("paddle sees a CUDA device here")
    overrides = [f"backend='{backend}'", "backend.device='cuda'", "actors=2"]
    with pytest.raises(ConfigError, match=r"\[backend\] device = 'cuda'.*'auto' or 'cpu'"):
        run_farm(tmp_path, [*overrides, "inference='central'"])
    assert not any(tmp_path.iterdir()), "a refused start left a run directory behind"
