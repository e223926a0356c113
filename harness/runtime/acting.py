"""Where a run's actions are computed: the :class:`ActingPlan`, decided once at build time
from ``run.inference`` (:func:`plan_acting`, among the start-up checks, with its refusals and
``'auto'``'s rule) and read by the rest of the run (``Run.acting``): the train loop's choice of
collector, the farm's actors and its policy server (``harness.runtime.inference``)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from harness.api import Agent
from harness.config import Config
from harness.errors import ConfigError
from harness.policy import own_policy
from harness.registry import AlgorithmSpec

AUTO_MIN_ACTORS = 128
"""``run.inference = "auto"`` serves a farm centrally from this many actors on (measured:
DQN on 64 actors of a 20 ms env 94.1% of the ideal per actor against 81.5% central; on 256,
29.9% against 57.2%; see :func:`choose_central`)."""


def central_refusal(agent: Agent) -> str | None:
    """Why ``agent`` cannot be served over the rows of whichever actors are waiting, or None
    when it can: its :class:`~harness.policy.Policy` keeps any per-env state as rows, which
    the server keeps for every env of the farm. An agent written before ``Policy`` (acting
    through ``sample``) with per-env acting state says so
    (:attr:`harness.api.Agent.per_env_acting_state`) and is served only when it keeps that
    state by row (:attr:`harness.api.Agent.acts_by_rows`)."""
    if agent.env_info.multi_agent:
        return (
            "its env is multi-agent (agent-keyed observation batches are not served centrally yet)"
        )
    if own_policy(agent) is None and agent.per_env_acting_state and not agent.acts_by_rows:
        return (
            f"{agent.name} keeps acting state per env between steps (Agent.per_env_acting_state: "
            "an ES perturbation, a DDPG ensemble head per episode, a recurrent Q-network's "
            "state), which one batch over whichever actors are waiting would mix up, and it "
            "cannot keep that state by row on the server (Agent.acts_by_rows, as recurrent "
            "PPO and IMPALA do)"
        )
    return None


@dataclass(frozen=True)
class ActingPlan:
    """Where a run's actions are computed, decided once at build time (:func:`plan_acting`,
    among the start-up checks) and read by the rest of the run (``Run.acting``): the train
    loop's choice of collector, the farm's actors and its policy server."""

    where: str
    """:data:`SERIAL` (no farm: this process acts for its own envs), :data:`PER_ACTOR` (each
    farm actor acts with its own copy of the policy) or :data:`CENTRAL` (a policy server in
    this process acts for every actor in batches)."""
    why: str
    """Why (``run.inference`` and, for ``'auto'``, its rule's reason), logged at start-up."""
    by_rows: bool = False
    """Central: the server keeps per-env acting state by row (a policy's state rows, or an
    older agent's :attr:`~harness.api.Agent.acts_by_rows`), so actors report their episode
    ends."""
    wait_s: float = 0.0
    """Central: how long a batch waits for more requests (``run.inference_wait_ms``)."""
    relay: bool = False
    """Central with remote actors (``run.cluster``): they reach the server through their
    transport's relay (:class:`harness.remote.SupportsRemoteInference`)."""

    @property
    def central(self) -> bool:
        """True when a policy server acts for the farm."""
        return self.where == CENTRAL


SERIAL, PER_ACTOR, CENTRAL = "serial", "actor", "central"
"""The values of :attr:`ActingPlan.where`."""

NO_FARM = ActingPlan(SERIAL, "run.actors = 0: no farm")
"""The plan of a serial run (``run.actors = 0``)."""


def plan_acting(config: Config, agent: Agent) -> ActingPlan:
    """The run's :class:`ActingPlan` for ``config`` (with a concrete ``run.actors``) and its
    ``agent``; refuses, before anything is written, a ``run.inference`` the run cannot have:
    'central' without a farm, or for an agent one batch cannot serve."""
    run = config.run
    if run.actors <= 0:
        if run.inference == "central":
            raise ConfigError(
                f"run.inference = 'central' batches the actions of a farm's actors, but "
                f"run.actors = {run.actors}: the envs step in this process, which acts with one "
                "batch already. Set run.actors (e.g. --actors 2), or leave run.inference = "
                "'actor'."
            )
        return NO_FARM
    central, why = choose_central(config, agent)
    if not central:
        return ActingPlan(PER_ACTOR, why)
    reason = central_refusal(agent)  # ('auto' never picks a refused agent: 'central' only)
    if reason is not None:
        raise ConfigError(
            f"run.inference = 'central' cannot serve algorithm {run.algo!r}: {reason}. "
            "Set run.inference = 'actor' (or 'auto', which picks it for this algorithm)."
        )
    return ActingPlan(
        CENTRAL,
        why,
        by_rows=keeps_rows(agent),
        wait_s=run.inference_wait_ms / 1000,
        relay=bool(run.cluster),
    )


_WARNED: set[str] = set()


def warn_agent_actors(spec: AlgorithmSpec) -> None:
    """A farm of an algorithm that declares no ``make_algorithm`` / ``make_policy``: its actors
    (and a policy server) build a whole agent to act, deprecated (one release, as the
    ``Agent.sample``/``predict`` hooks): a ``DeprecationWarning`` naming the replacement, once
    per algorithm."""
    if spec.acts_without_agent or spec.name in _WARNED:
        return
    _WARNED.add(spec.name)
    warnings.warn(
        f"Algorithm {spec.name!r} (plugin {spec.plugin or '?'}) declares no "
        "AlgorithmSpec.make_algorithm / make_policy, so each farm actor builds a whole agent "
        "(replay, optimiser) only to act; that fallback is deprecated and goes in the next "
        "release. Declare both (docs/plugins.md, 'A policy without an agent'; "
        "harness.testing.check_algorithm checks them).",
        DeprecationWarning,
        stacklevel=2,
    )


def keeps_rows(agent: Agent) -> bool:
    """Whether ``agent``'s acting keeps per-env state that a policy server keeps by row."""
    policy = own_policy(agent)
    if policy is None:
        return agent.per_env_acting_state and agent.acts_by_rows
    return bool(policy.initial_state(1))


def choose_central(config: Config, agent: Agent) -> tuple[bool, str]:
    """Whether a farm of ``config`` acts centrally, and why (logged at start-up): the rule
    :func:`plan_acting` applies to a farm (``run.actors > 0``).

    ``auto``'s rule, from side-by-side runs on the 2-core dev VM (docs/distributed.md, "When
    each wins", has the numbers and commands): many actors go central (one batched forward
    instead of one per actor, no framework in hundreds of processes: DQN on 256 actors of a
    20 ms env delivered 57.2% of the ideal central against 29.9% per actor in one run); few
    actors act per actor, image policies included: the server's forward runs on one thread
    while the actors' run on every core, and a batch of ~5 rows saves little (IMPALA on Pong,
    2 actors x 4 envs: 38.4% against 28.2% of the plain envs with the float CNN, 44.0%
    against 33.0% with the int8 copy, the CPU per frame equal within 4%); DQN on 64 actors
    was 94.1% per actor against 81.5% central. An image policy with a learner on a GPU
    (``run.inference_device = 'learner'``) goes central whatever the count: the CNN's batched
    forward then runs on the GPU instead of on every actor's CPU (SEED RL's design; not yet
    measured here, tools/gpu_check.sh does where a GPU is lent)."""
    run = config.run
    if run.inference == "actor":
        return False, "run.inference = 'actor'"
    if run.inference == "central":
        return True, "run.inference = 'central'"
    if run.cluster:
        return False, (
            "auto: remote actors (run.cluster) act with their own copies (central over the "
            "network costs a round trip per vector step; set run.inference = 'central' to have it)"
        )
    reason = central_refusal(agent)
    if reason is not None:
        return False, f"auto: the agent cannot be batched centrally ({reason})"
    device = str(agent.backend.device)
    image = len(agent.env_info.observation.shape) >= 2
    if run.inference_device == "learner" and device != "cpu" and image:
        return True, (
            f"auto: an image policy and a learner on {device}: the farm's forward batched there "
            "(actors would run the CNN on the CPU)"
        )
    if run.actors >= AUTO_MIN_ACTORS:
        return True, f"auto: {run.actors} actors (>= {AUTO_MIN_ACTORS}) share one batched policy"
    return False, (
        f"auto: {run.actors} actors (< {AUTO_MIN_ACTORS}) act faster with their own copies "
        "(their forwards run on every core, a server's on one thread)"
    )
