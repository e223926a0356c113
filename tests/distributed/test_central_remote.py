"""Central inference for remote actors (``run.inference = "central"`` with ``run.cluster``):
a real ``harness cluster`` on loopback, real actor processes placed by its master, the
ZeroMQ relay of :mod:`harness_zmq.inference` in the learner process.

- The relay answers a remote actor exactly what the agent's own ``sample`` gives for the
  same observations and weights; malformed frames, a slot out of range and a replaced
  actor's late request are dropped (and counted), never touching the shared arrays.
- PPO on CartPole over two cluster actors that act through the relay reaches the threshold,
  every rollout acted by the newest weights.
- Remote actors killed every few seconds while the policy server and the relay fail: the
  run completes and every transition received was observed once.
- Off loopback the relay takes CURVE connections only: tests/distributed/test_multihost.py
  trains through it across two network namespaces.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from test_central_inference import PACK, ServerFault, assert_acts_as  # same directory
from test_cluster import Cluster, cluster, env  # noqa: F401 - fixtures
from test_farm import Killer, Periodic, run_farm

import harness
from harness.config import layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import env_info, make_agent, make_envs
from harness.runtime.inference import PolicyServer
from harness_zmq.security import Guard, set_process_keys

pytestmark = pytest.mark.distributed


def _agents(num_envs: int) -> tuple[Any, Any]:
    """A learner and a maker of acting agents for PPO on CartPole with ``num_envs`` envs."""
    registry = collect_registry(make_plugin_manager())
    config = resolve(layer(PACK, [], [f"num_envs={num_envs}"], environ={}), registry)
    envs = make_envs(config, registry, 1, seed=None)
    info = dataclasses.replace(env_info(config.run.env, envs), num_envs=num_envs)
    envs.close()

    def acting() -> Any:
        agent = make_agent(config, registry, info)
        agent.rng = np.random.default_rng(5)
        return agent

    return make_agent(config, registry, info), acting


def test_the_relay_answers_what_the_agent_samples_and_drops_what_is_malformed(
    cluster: Cluster,  # noqa: F811
) -> None:
    from harness_zmq.inference import HEADER_BYTES, MAGIC, _header

    learner, acting = _agents(8)
    server = PolicyServer(acting, [3, 5], by_rows=False)  # (feed-forward PPO: no state)
    client = harness.connect(cluster.address)
    relay = client.serve_inference(server.link)
    actors: list[Any] = []
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.linger = 0
    # the relay takes CURVE peers only: this process stands in for remote actors, which hold
    # the cluster's keys (from their spawn request), and for a key holder sending garbage
    set_process_keys(client.keys)
    Guard(zmq.Context.instance(), client.keys).client(raw)
    try:
        assert relay.link.endpoint.startswith("tcp://127.0.0.1:")
        server.publish(3, learner.weights(), 0)
        actors = [relay.link.attach(i) for i in range(2)]
        assert_acts_as(learner, actors, steps=5, rows=(slice(0, 3), slice(3, 8)))
        assert [a.oldest_version for a in actors] == [3, 3]

        # what a peer that is not a remote actor of this run may send: never an answer
        raw.connect(relay.link.endpoint)
        obs3 = np.zeros((3, 4), np.float32)
        bad = [
            [b"hello"],  # one frame
            [b"x" * HEADER_BYTES, obs3.tobytes(), bytes(3)],  # not the magic number
            [_header(MAGIC, 7, 1, 1), obs3.tobytes(), bytes(3)],  # no slot 7
            [_header(MAGIC, 0, 1, 1), obs3.tobytes()[:-4], bytes(3)],  # short observations
            [_header(MAGIC, 0, 1, 1), obs3.tobytes(), bytes(2)],  # short flags
        ]
        for frames in bad:
            raw.send_multipart(frames)
        deadline = 50
        while relay.stats()["farm/inference_malformed"] < len(bad) and deadline:
            raw.poll(100)
            deadline -= 1
        assert relay.stats()["farm/inference_malformed"] == len(bad)
        assert not raw.poll(300), "a malformed request was answered"
        # the actors go on being served after all that
        got, _ = actors[0].sample(obs3 + 0.5)
        assert got.shape == (3,)

        # a replaced actor (a new incarnation) takes the slot; its predecessor's late
        # requests are dropped without an answer
        old = actors[0]
        actors[0] = relay.link.attach(0)
        actors[0].sample(obs3 - 0.5)
        raw.send_multipart([_header(MAGIC, 0, old.incarnation, 99), obs3.tobytes(), bytes(3)])
        assert not raw.poll(300), "a retired actor's request was answered"
        assert relay.stats()["farm/inference_malformed"] == len(bad)
    finally:
        set_process_keys(None)
        raw.close()
        for actor in actors:
            actor.close()
        relay.close()
        client.close()
        server.close()


def test_ppo_on_two_cluster_actors_acting_through_the_relay_solves_cartpole(
    cluster: Cluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    overrides = ["actors=2", "num_envs=8", "seed=1", "inference='central'"]
    result, rec = run_farm(tmp_path, [*overrides, f"cluster='{cluster.address}'"])
    assert rec.central, "the farm did not act centrally"
    assert result.best_eval >= 475.0, f"PPO, remote central inference: {result.best_eval:.1f}"
    farm = [m for m in rec.metrics if "farm/policy_lag" in m]
    assert max(m["farm/policy_lag_max"] for m in farm) == 0.0, "PPO learned from stale weights"
    assert farm[-1]["farm/received_steps"] == rec.final_step == rec.env_steps
    # every vector step of every actor went through the relay
    assert farm[-1]["farm/inference_remote_requests"] >= rec.env_steps / 4
    assert farm[-1]["farm/inference_malformed"] == 0.0


class RelayFault(Periodic):
    """Makes the relay's loop fail at its next answer every ``every`` seconds: it starts
    again with the state of its slots (open requests included)."""

    @property
    def faults(self) -> int:
        return self.count

    def strike(self, run: Any) -> None:
        relay = run.collector.relay
        reply = relay._reply

        def failing_once(index: int) -> None:
            relay._reply = reply  # (an instance attribute: the class's method again after)
            raise RuntimeError("relay loop lost (injected)")

        relay._reply = failing_once


def test_remote_actors_killed_while_the_server_and_the_relay_fail_lose_nothing(
    cluster: Cluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    """kill -9 of a cluster actor every 3 s, a policy-server failure every 4 s and a relay
    failure every 5 s (Delay env, 5 ms a step), streamed; every transition received was
    observed exactly once."""
    killer, fault, relay_fault = Killer(every=3.0), ServerFault(every=4.0), RelayFault(5.0)
    result, rec = run_farm(
        tmp_path,
        [
            "algo='random'",
            "env='harness/Delay-v0'",
            "env.kwargs={step_seconds=0.005}",
            "actors=2",
            "num_envs=4",
            "total_steps=10_000_000",
            "max_seconds=25",
            "max_policy_lag=2",
            "eval_every=0",
            "eval_episodes=2",
            "checkpoint_every=0",
            "inference='central'",
            f"cluster='{cluster.address}'",
        ],
        plugins=(killer, fault, relay_fault),
    )
    assert rec.central
    farm = [m for m in rec.metrics if "farm/actor_restarts" in m]
    assert result.stopped_early, "the run should end by run.max_seconds"
    assert killer.kills >= 4 and fault.faults >= 3, "the run was too short to test"
    assert result.steps >= 3_000, f"only {result.steps} steps in 25 s"
    assert farm[-1]["farm/actor_restarts"] >= killer.kills - 1  # the last kill may be unseen
    assert farm[-1]["farm/inference_restarts"] >= fault.faults - 1
    assert relay_fault.faults >= 2
    assert farm[-1]["farm/inference_relay_restarts"] >= relay_fault.faults - 1
    assert farm[-1]["farm/received_steps"] == rec.final_step == rec.env_steps == result.steps
