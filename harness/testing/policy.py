"""check_algorithm's part about acting: the agent's :class:`harness.policy.Policy`."""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.api import EnvInfo, batch_size, tree_map
from harness.policy import Acting, AgentPolicy, Policy, State
from harness.testing.common import _check, _fail

ROW_SUBSETS = ("every other row", "the last five rows", "one row")


def _rows(n: int, which: str) -> np.ndarray:
    if which == "every other row":
        return np.arange(0, n, 2)
    if which == "the last five rows":
        return np.arange(max(0, n - 5), n)
    return np.array([n // 2])


def _greedy_steps(policy: Policy, batches: list[Any]) -> tuple[list[Any], State]:
    """Greedy actions for consecutive observation batches of the same rows, from the rows'
    initial state reset as an evaluation starts; and the state after them."""
    n = batch_size(batches[0])
    state = policy.reset(policy.initial_state(n), np.ones(n, bool), explore=False)
    actions = []
    for obs in batches:
        acted, _, state = policy.act(obs, state, explore=False)
        actions.append(acted)
    return actions, state


def check_policy(
    learner: Any, actor: Any, info: EnvInfo, batches: list[Any], who: str, differs: Any
) -> None:
    """``learner.policy()`` (``Agent.policy``) is a :class:`~harness.policy.Policy` whose greedy
    acting for any subset of rows gives those rows' actions of acting for all of them (two
    steps, so per-row state is exercised), whose explicit state is not changed in place and
    round-trips (a copy acts like the original), and which, taken from ``actor`` (an agent of
    another seed) after it acted and given the learner's weights with ``load``, acts like the
    learner's: not a stale copy; rows it resets act as new envs' rows. ``batches``: two
    observation batches of the same rows; ``differs(a, b)`` says how greedy actions ``a``
    differ from ``b`` (None: they agree)."""
    policy = learner.policy()
    _check(
        isinstance(policy, Policy),
        who,
        f"Agent.policy() returned {type(policy).__name__}, not a harness.policy.Policy",
    )
    expected, _ = _greedy_steps(policy, batches)
    n = batch_size(batches[0])
    for which in ROW_SUBSETS:
        rows = _rows(n, which)
        subset = [tree_map(lambda x, r=rows: x[r], obs) for obs in batches]
        acted, _ = _greedy_steps(learner.policy(), subset)
        for t, (got, want) in enumerate(zip(acted, expected, strict=True)):
            mismatch = differs(got, tree_map(lambda x, r=rows: np.asarray(x)[r], want))
            if mismatch is not None:
                _fail(
                    who,
                    f"its policy, acting greedily for {which} of {n} (step {t + 1}), {mismatch}"
                    " of acting for all rows: a row's action must depend on that row's "
                    "observation and state only (a policy server acts for any rows together)",
                )
    if not isinstance(policy, AgentPolicy):  # (the adapter keeps its state in the agent)
        _check_state(policy, batches, who, differs)
        _check_reset(policy, batches, who, differs)
    _check_load(learner, actor, batches, who, differs)


def _check_state(policy: Policy, batches: list[Any], who: str, differs: Any) -> None:
    """Acting does not write into the state it was given, and a copy of a state acts like
    the state itself: the stepper may keep, copy and slice it."""
    _, state = _greedy_steps(policy, batches[:1])
    kept = {key: np.array(value, copy=True) for key, value in state.items()}
    first, _, _ = policy.act(batches[1], state, explore=False)
    for key, value in kept.items():
        if not np.array_equal(value, state[key]):
            _fail(who, f"its policy's act() changed its state argument {key!r} in place")
    again, _, _ = policy.act(batches[1], kept, explore=False)
    mismatch = differs(again, first)
    if mismatch is not None:
        _fail(who, f"its policy, acting from a copy of its state, {mismatch} of the original")


def _check_reset(policy: Policy, batches: list[Any], who: str, differs: Any) -> None:
    """Rows that ``reset`` starts over act greedily like the rows of new envs (an episode's
    first step), whatever they acted before: their state was reset."""
    n = batch_size(batches[0])
    _, used = _greedy_steps(policy, batches)
    mask = np.arange(n) % 2 == 0
    got, _, _ = policy.act(batches[0], policy.reset(used, mask, explore=False), explore=False)
    want, _ = _greedy_steps(policy, batches[:1])
    mismatch = differs(
        tree_map(lambda x: np.asarray(x)[mask], got),
        tree_map(lambda x: np.asarray(x)[mask], want[0]),
    )
    if mismatch is not None:
        _fail(
            who,
            f"its policy, acting greedily after reset() of every other row, {mismatch} on those "
            "rows of acting for new envs: reset must start those rows' state over (an episode "
            "ended there)",
        )


def _check_load(learner: Any, actor: Any, batches: list[Any], who: str, differs: Any) -> None:
    if not learner.weights():  # (a policy without parameters, random: nothing to load)
        return
    policy = actor.policy()
    before, _ = _greedy_steps(policy, batches)
    policy.load(learner.weights(), 7)
    _check(
        policy.version == 7, who, f"after load(weights, 7) its policy's version is {policy.version}"
    )
    after, _ = _greedy_steps(policy, batches)
    want, _ = _greedy_steps(learner.policy(), batches)
    mismatch = differs(after[-1], want[-1])
    if mismatch is not None:
        stale = differs(after[-1], before[-1]) is None
        _fail(
            who,
            f"its policy, after load() of the learner's weights, {mismatch}"
            + (", acting exactly as before" if stale else "")
            + ": a policy must act with the weights it loaded (take its acting copies again).",
        )


def check_agentless_policy(
    spec: Any, learner: Any, backend: Any, config: Any, batches: list[Any], who: str, differs: Any
) -> None:
    """Where ``spec`` declares ``make_algorithm`` and ``make_policy`` (a farm actor then acts
    without an agent), the policy they make from an :class:`~harness.policy.Acting` given the
    learner's weights, generator state and env-step count acts like the learner's own
    policy: greedily, and exploring with generators in the same state (so the schedules it
    reads, epsilon or a warm-up, follow the same count)."""
    if getattr(spec, "make_algorithm", None) is None or getattr(spec, "make_policy", None) is None:
        return
    info = learner.env_info
    algorithm = spec.make_algorithm(backend, info, config)
    acting = Acting(
        algorithm, info, config, _copy(learner.rng), learner.total_steps, learner.env_steps
    )
    policy = spec.make_policy(acting)
    _check(
        isinstance(policy, Policy),
        who,
        f"make_policy returned {type(policy).__name__}, not a harness.policy.Policy",
    )
    policy.load(learner.weights(), 3)
    own = learner.policy()
    got, _ = _greedy_steps(policy, batches)
    want, _ = _greedy_steps(own, batches)
    mismatch = differs(got[-1], want[-1])
    if mismatch is not None:
        _fail(
            who,
            f"the policy make_policy made without an agent, given the learner's weights, acting "
            f"greedily {mismatch} of the agent's policy: a farm actor would act otherwise than "
            "the learner (make_policy must read everything from its ActingParts)",
        )
    n = batch_size(batches[0])
    # exploring, it is compared with what a farm actor built with an agent acts with: an agent
    # given the learner's weights, env-step count and generator state, not the learner
    # itself, whose per-process acting state (ES's half-used antithetic pairs) no actor has
    twin = spec.make_agent(info, backend, config, seed=0, total_steps=learner.total_steps)
    twin.set_weights(learner.weights())
    twin.env_steps, twin.rng = learner.env_steps, _copy(learner.rng)
    drawn = []  # (each from its own generator, as a farm actor's stepper calls it)
    for made in (policy, twin.policy()):
        actions, _, _ = made.act(batches[0], made.initial_state(n), None, explore=True)
        drawn.append(actions)
    mismatch = differs(drawn[0], drawn[1])
    if mismatch is not None:
        _fail(
            who,
            f"the policy make_policy made without an agent, exploring from the learner's "
            f"generator state at its env-step count ({learner.env_steps}), {mismatch} of an "
            "agent's policy given the same weights, count and generator: its exploration "
            "(schedule, generator) must come from its ActingParts (parts.env_steps, parts.rng),"
            " as the agent's does",
        )


def _copy(rng: np.random.Generator) -> np.random.Generator:
    copy = np.random.default_rng()
    copy.bit_generator.state = rng.bit_generator.state
    return copy
