"""check_algorithm: an agent driven with synthetic transitions the way the runner and an actor
farm use it."""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import EnvInfo, SpaceInfo, Transition, batch_size
from harness.registry import AlgorithmSpec
from harness.testing.common import (
    _agent_spaces,
    _check,
    _close,
    _fail,
    _named,
    _obs_batch,
    _owner,
    _per_agent,
    _same,
    _snapshot,
)
from harness.testing.policy import check_agentless_policy, check_policy

log = logging.getLogger(__name__)

_BOUND_TOL = 1e-5
"""Relative slack on box bounds: an action clipped to float32(0.42) may sit 1e-8 above the
float64 bound 0.42."""

AGENT_METHODS = (
    "sample",
    "predict",
    "observe",
    "learn",
    "save",
    "restore",
    "weights",
    "set_weights",
)


def check_algorithm(
    spec: AlgorithmSpec,
    backend: Any,
    env_info: EnvInfo,
    *,
    steps: int = 2048,
    config: Any = None,
    seed: int = 0,
) -> None:
    """Drive an agent from ``spec`` with synthetic transitions, the way the runner does.

    ``config`` defaults to ``spec.config_cls()``. Builds the agent with
    ``make_agent(env_info, backend, config, seed=, total_steps=steps)``, feeds it ``steps`` env
    steps of random observations matching ``env_info`` (``learn()`` every ``rollout_len``
    vector steps) and checks: ``sample``/``predict`` shapes and valid actions (discrete in
    ``[0, n)``; box actions within the bounds, give or take float32 rounding; ``predict`` for
    any batch size, deterministic); ``learn`` returns finite floats under namespaced keys
    (``losses/...``); learning changes ``weights()`` within ``steps``; ``save`` then
    ``restore`` into a new agent reproduces its weights, ``predict`` and ``sample`` (RNG and
    counters included); and ``weights()`` / ``set_weights()`` carry the policy to a fresh
    agent, as a farm broadcasts it.

    The agents receiving a checkpoint or weights have acted before (``sample`` and
    ``predict``), as a farm actor has when the next weights arrive, and must then act like the
    learner on 64 observations: an acting copy (``backend.inference``) not taken again after
    ``set_weights``/``load_state`` fails here. That needs the receiving agent, built with
    another seed, to act differently from the learner beforehand; where it does not (weights
    initialised independently of the seed), the comparison is skipped with a logged warning.

    Its :meth:`~harness.api.Agent.policy` is checked too: greedy acting for any subset of
    rows equals acting for all, its state round-trips, and a policy given the learner's
    weights by ``load`` acts like the learner. Where the spec declares ``make_algorithm`` and
    ``make_policy`` (farm actors then act without an agent), that policy, given the learner's
    weights, generator state and env-step count, acts like the agent's own, greedily and
    exploring.
    """
    kinds = sorted({a.kind for a in _agent_spaces(env_info, "actions").values()})
    kind = "/".join(kinds)
    where = "a multi-agent env" if env_info.multi_agent else "an env"
    who = f"algorithm {spec.name!r}{_owner(spec.plugin)} on {where} with {kind} actions"
    _check(
        all(k in spec.action_spaces for k in kinds),
        who,
        f"the spec declares action_spaces={spec.action_spaces}; check it on an EnvInfo with one "
        f"of those",
    )
    agents = getattr(spec, "agents", "single")
    _check(
        agents == "any" or (agents == "multi") == env_info.multi_agent,
        who,
        f"the spec declares agents={agents!r}; check it on a "
        f"{'multi' if agents == 'multi' else 'single'}-agent EnvInfo",
    )
    config = spec.config_cls() if config is None else config

    def make(agent_seed: int) -> Any:
        backend.seed(agent_seed)
        agent = spec.make_agent(env_info, backend, config, seed=agent_seed, total_steps=steps)
        for method in AGENT_METHODS:
            _check(callable(getattr(agent, method, None)), who, f"the agent has no {method}()")
        rollout = getattr(agent, "rollout_len", None)
        _check(
            isinstance(rollout, int) and rollout >= 1,
            who,
            f"agent.rollout_len = {rollout!r}, must be an int >= 1",
        )
        return agent

    rng = np.random.default_rng(seed)
    agent = make(seed)
    _feed(agent, env_info, steps, rng, who)
    probe = _obs_batch(env_info, env_info.num_envs, rng)
    odd_batch = _obs_batch(env_info, env_info.num_envs + 3, rng)
    many = _obs_batch(env_info, TRANSFER_PROBE, rng)
    _check_predict(agent, env_info, odd_batch, who)
    _check_predict(agent, env_info, many, who)
    learned = _greedy(agent, many)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "checkpoint"
        agent.save(directory)
        expected = _samples(agent, probe), _greedy(agent, odd_batch), _snapshot(agent.weights())
        restored = make(seed + 1)
        acted = _act(restored, env_info, many, rng)
        restored.restore(directory)
        fresh = make(seed + 4)  # restored without acting first: no acting state to refresh
        fresh.restore(directory)
        actual = _samples(restored, probe), _greedy(restored, odd_batch), restored.weights()
    _check_same_weights(expected[2], actual[2], "restore(save()) gave different weights()", who)
    _check_learner_acting(agent, fresh, restored, many, learned, who)
    _check_acting_copy(
        restored, many, acted, learned, "restore(directory) of the learner's save()", who
    )
    _close(
        who,
        "predict() after save/restore into a new agent",
        actual[1],
        expected[1],
        rtol=1e-6,
        atol=1e-6,
    )
    _close(
        who,
        "sample() after save/restore, from the saved state (RNG or counters not saved?)",
        actual[0],
        expected[0],
        rtol=1e-6,
        atol=1e-6,
    )
    _check_broadcast(agent, make(seed + 2), env_info, many, odd_batch, learned, rng, who)
    if getattr(agent, "acts_by_rows", False):
        _check_rows(make(seed + 3), make(seed + 3), env_info, rng, who)
    second = _obs_batch(env_info, TRANSFER_PROBE, rng)
    check_policy(agent, make(seed + 5), env_info, [many, second], who, _differs)
    check_agentless_policy(spec, agent, backend, config, [many, second], who, _differs)


def _check_rows(
    serial: Any, rows: Any, env_info: EnvInfo, rng: np.random.Generator, who: str
) -> None:
    """An agent that keeps its per-env acting state by row (``acts_by_rows``, central
    inference's policy server) acts through ``sample_rows`` over all of its envs exactly as
    ``sample`` does, its ``rows_ended`` resetting what ``episodes_ended`` resets. ``serial``
    and ``rows`` are two fresh agents of one seed."""
    n = env_info.num_envs
    every = slice(0, n)
    for t in range(4):
        obs = _obs_batch(env_info, n, rng)
        expected = serial.sample(obs)
        actual = rows.sample_rows(obs, every, n)
        _close(
            who,
            f"sample_rows over all rows (step {t}) against sample()",
            actual[0],
            expected[0],
            rtol=1e-6,
            atol=1e-6,
        )
        for key, value in expected[1].items():
            _check(key in actual[1], who, f"sample_rows() gave no extra {key!r} (sample() does)")
            _close(
                who,
                f"sample_rows()'s extra {key!r} (step {t})",
                actual[1][key],
                value,
                rtol=1e-6,
                atol=1e-6,
            )
        ended = np.arange(n) % 2 == t % 2  # (some envs' episodes end after each step)
        serial.episodes_ended(ended)
        rows.rows_ended(np.flatnonzero(ended), n)


TRANSFER_PROBE = 64
"""Observations on which a fresh agent's greedy actions are compared with the learner's:
enough that two different discrete policies almost surely disagree on one of them."""


def _weights_difference(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> str | None:
    """Where weights ``a`` and ``b`` differ, key by key (None when they are equal)."""
    if a.keys() != b.keys():
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        return f"keys differ: only in the first {only_a}, only in the second {only_b}"
    for key in a:
        x, y = np.asarray(a[key]), np.asarray(b[key])
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"{key!r} is {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
        if not np.array_equal(x, y):
            wrong = int(np.sum(x != y))
            return f"{key!r} differs in {wrong} of {x.size} values"
    return None


def _check_same_weights(
    expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray], what: str, who: str
) -> None:
    found = _weights_difference(expected, actual)
    if found is not None:
        _fail(who, f"{what}: {found}")


def _check_not_aliased(
    held: Mapping[str, np.ndarray], before: Mapping[str, np.ndarray], t: int, who: str
) -> None:
    """weights() returned before a learn() must still hold what they held: a farm sends them
    to actors and a checkpoint writes them while learning goes on, so arrays that learn()
    overwrites in place change under those readers."""
    changed = [k for k in before if k in held and not np.array_equal(held[k], before[k])]
    if changed:
        _fail(
            who,
            f"learn() after step {t} overwrote arrays that an earlier weights() returned, in "
            f"place ({', '.join(repr(k) for k in changed[:3])}"
            f"{' ...' if len(changed) > 3 else ''}): weights() must return copies (e.g. "
            "np.array(x, copy=True), or backend.get_weights), not views of the parameters.",
        )


def _check_learner_acting(
    learner: Any, fresh: Any, restored: Any, many: Any, learned: Any, who: str
) -> None:
    """The learner acts with its own current weights: where two agents restored from its
    checkpoint (one that had acted before, one that had not) agree with each other and not
    with the learner, it is the learner's acting copy that is stale, left behind by its own
    learn()."""
    if not learner.weights():
        return
    truth = _greedy(fresh, many)
    mismatch = _differs(learned, truth)
    if mismatch is None or _differs(_greedy(restored, many), truth) is not None:
        return  # (agreeing, or a receiving agent's fault: _check_acting_copy names it)
    what = mismatch.replace("the learner", "its restored checkpoint")
    _fail(
        who,
        f"after learn(), the learner's own predict() {what} on {batch_size(many)} "
        "observations, where two agents restored from its save() agree with each other: "
        "learn() changed the weights but left the learner's acting copy stale. Take the "
        "numpy copy (backend.inference(model)) and any other cached acting state again at "
        "the end of learn() (whenever the weights change), or the learner evaluates and "
        "acts with old weights.",
    )


def _check_broadcast(
    learner: Any,
    actor: Any,
    info: EnvInfo,
    many: Any,
    odd_batch: Any,
    learned: Any,
    rng: np.random.Generator,
    who: str,
) -> None:
    """The learner's weights carried to an agent that has already acted, the way a farm
    actor receives them (harness.runtime.farm.ActorWorker.set_weights)."""
    weights = learner.weights()
    _check(
        all(isinstance(k, str) and isinstance(v, np.ndarray) for k, v in weights.items()),
        who,
        "weights() must map str names to numpy arrays",
    )
    acted = _act(actor, info, many, rng)
    actor.set_weights(weights)
    actor.env_steps = learner.env_steps
    _check_same_weights(
        weights, actor.weights(), "set_weights(w) then weights() differs from w", who
    )
    _check_acting_copy(actor, many, acted, learned, "set_weights(learner.weights())", who)
    _close(
        who,
        "predict() after set_weights(weights())",
        _greedy(actor, odd_batch),
        _greedy(learner, odd_batch),
        rtol=1e-6,
        atol=1e-6,
    )


def _act(agent: Any, info: EnvInfo, many: Any, rng: np.random.Generator) -> Any:
    """Act once the way a runner does (sample for a vector step, predict for an evaluation),
    so that whatever acting state the agent keeps exists before its weights change: a farm
    actor acts with one version of the weights, then receives the next. Returns the greedy
    actions on ``many`` by the agent's own weights."""
    agent.sample(_obs_batch(info, info.num_envs, rng))
    return _greedy(agent, many)


def _greedy(agent: Any, obs: Any) -> Any:
    """predict() as an evaluation starts: per-env predict state (a recurrent agent's) reset."""
    reset = getattr(agent, "predict_episodes_ended", None)
    if reset is not None:
        reset(np.ones(batch_size(obs), bool))
    return agent.predict(obs)


def _check_acting_copy(agent: Any, obs: Any, before: Any, learned: Any, how: str, who: str) -> None:
    """After ``how``, ``agent`` acts like the learner, not like it did before (``before``):
    the numpy copies acting uses (``backend.inference``) were taken again."""
    if not agent.weights():  # a policy without parameters (random) has no copy to refresh
        return
    if _differs(before, learned) is None:
        # Only a policy that already acted like the learner could hide a stale copy here;
        # different seeds and a little learning make that rare enough to let it pass.
        log.warning(
            "%s: a fresh agent already acts like the learner on %d observations, so whether "
            "%s refreshes its acting copy went unchecked",
            who,
            batch_size(obs),
            how,
        )
        return
    mismatch = _differs(_greedy(agent, obs), learned)
    if mismatch is None:
        return
    stale = _differs(_greedy(agent, obs), before) is None
    _fail(
        who,
        f"after {how}, an agent that had already acted {mismatch} on {batch_size(obs)} "
        f"observations"
        + (", acting exactly as before the new weights arrived" if stale else "")
        + ". Its acting copy is stale: take the numpy copy (backend.inference(model)) and any "
        "other cached acting state again whenever the weights change (set_weights, "
        "load_state), or a farm's actors act with their first weights forever.",
    )


def _differs(a: Any, b: Any, tol: float = 1e-5) -> str | None:
    """How greedy actions ``a`` differ from the learner's ``b`` (None when they agree):
    discrete actions exactly, box actions within ``tol``."""
    if isinstance(b, Mapping):
        for key in b:
            found = _differs(a[key], b[key], tol)
            if found is not None:
                return f"{found} (agent {key!r})"
        return None
    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape:
        return f"returns actions of shape {x.shape}, the learner {y.shape}"
    if x.dtype.kind in "iub":
        wrong = int(np.sum(x != y))
        return f"chose {wrong} of {x.size} greedy actions unlike the learner" if wrong else None
    diff = np.abs(x.astype(np.float64) - y.astype(np.float64))
    scale = tol * np.maximum(1.0, np.abs(y.astype(np.float64)))
    if np.all(diff <= scale):
        return None
    return f"predicted actions up to {float(diff.max()):.3g} away from the learner's"


def _samples(agent: Any, obs: Any, draws: int = 8) -> Any:
    """Several sample() calls in a row, so a lucky match of random actions is unlikely, from
    new episodes (per-env acting state is whoever steps the envs': a resumed run starts new
    episodes, and so does this)."""
    agent.episodes_ended(np.ones(batch_size(obs), bool))
    draws_ = [agent.sample(obs)[0] for _ in range(draws)]
    if isinstance(draws_[0], Mapping):
        return {a: np.stack([d[a] for d in draws_]) for a in draws_[0]}
    return np.stack(draws_)


def _feed(agent: Any, info: EnvInfo, steps: int, rng: np.random.Generator, who: str) -> None:
    """Feed synthetic transitions, calling learn() every rollout, for up to ``steps`` env
    steps; the weights must change (unless the policy has none). Stops one rollout after the
    first change (that learn() call, on an already-updated policy, is checked too) to keep the
    check fast."""
    n = info.num_envs
    held = agent.weights()  # as a caller keeps them (a farm's broadcast, a checkpoint)
    before = _snapshot(held)
    changed_at: int | None = None
    obs = _obs_batch(info, n, rng)
    vector_steps = max(1, steps // n)
    for t in range(vector_steps):
        actions, extras = _checked_sample(agent, obs, info, f"sample() at step {t}", who)
        next_obs = _obs_batch(info, n, rng)
        terminated = rng.random(n) < 0.05
        truncated = ~terminated & (rng.random(n) < 0.02)
        rewards: Any = rng.standard_normal(n)
        if info.multi_agent:
            rewards = {a: rng.standard_normal(n) for a in info.agents}
        agent.observe(Transition(obs, actions, rewards, next_obs, terminated, truncated, extras))
        ended = getattr(agent, "episodes_ended", None)  # (optional outside harness.api.Agent)
        if ended is not None and (terminated | truncated).any():
            ended(terminated | truncated)
        obs = _obs_batch(info, n, rng)
        if (t + 1) % agent.rollout_len == 0:
            _check_metrics(agent.learn(), f"learn() after step {t}", who)
            if changed_at is not None:
                return
            if not _same(before, agent.weights()):
                changed_at = t
                _check_not_aliased(held, before, t, who)
    if not before:  # a policy without parameters (e.g. random) has nothing to update
        return
    _check(
        changed_at is not None,
        who,
        f"weights() never changed over {vector_steps * n} env steps of learning: learn() does "
        f"not update the policy, or it starts later (pass a larger steps= or a config that "
        f"learns sooner)",
    )


def _checked_sample(
    agent: Any, obs: Any, info: EnvInfo, where: str, who: str
) -> tuple[Any, Mapping[str, np.ndarray]]:
    out = agent.sample(obs)
    _check(isinstance(out, tuple) and len(out) == 2, who, f"{where} must return (actions, extras)")
    actions, extras = out
    n = batch_size(obs)
    _check_actions(actions, info, n, where, who, in_bounds=True)
    _check(isinstance(extras, Mapping), who, f"{where}: extras is {type(extras).__name__}")
    for key, value in extras.items():
        _check(
            isinstance(value, np.ndarray) and value.shape[:1] == (n,),
            who,
            f"{where}: extras[{key!r}] must be a numpy array with {n} rows",
        )
    return actions, extras


def _check_metrics(metrics: Any, where: str, who: str) -> None:
    _check(isinstance(metrics, Mapping), who, f"{where} returned {type(metrics).__name__}")
    for key, value in metrics.items():
        _check(
            isinstance(key, str) and "/" in key,
            who,
            f"{where}: metric key {key!r} is not namespaced (e.g. 'losses/value_loss')",
        )
        ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(
            value, bool
        )
        _check(
            ok and math.isfinite(float(value)),
            who,
            f"{where}: {key} = {value!r} is not a finite float",
        )


def _check_actions(
    actions: Any, info: EnvInfo, batch: int, where: str, who: str, *, in_bounds: bool
) -> None:
    by_agent = _per_agent(actions, info, f"{where}: actions", who)
    for agent, space in _agent_spaces(info, "actions").items():
        _check_agent_actions(
            by_agent[agent], space, batch, _named(where, agent), who, in_bounds=in_bounds
        )


def _check_agent_actions(
    actions: Any, space: SpaceInfo, batch: int, where: str, who: str, *, in_bounds: bool
) -> None:
    _check(isinstance(actions, np.ndarray), who, f"{where} returned {type(actions).__name__}")
    if space.kind == "discrete":
        _check(
            actions.shape == (batch,), who, f"{where}: shape {actions.shape}, expected ({batch},)"
        )
        _check(
            actions.dtype.kind in "iu", who, f"{where}: discrete actions have dtype {actions.dtype}"
        )
        _check(
            bool(np.all((actions >= 0) & (actions < space.n))),
            who,
            f"{where}: actions {actions} outside [0, {space.n})",
        )
        return
    want = (batch, *space.shape)
    _check(actions.shape == want, who, f"{where}: shape {actions.shape}, expected {want}")
    _check(actions.dtype.kind == "f", who, f"{where}: box actions have dtype {actions.dtype}")
    _check(bool(np.all(np.isfinite(actions))), who, f"{where}: non-finite actions")
    if in_bounds and space.low:
        _check_box_bounds(actions, space, where, who)


def _check_box_bounds(actions: np.ndarray, space: SpaceInfo, where: str, who: str) -> None:
    """Every action inside ``[low, high]``, give or take float32 rounding of the bounds."""
    low = np.broadcast_to(np.asarray(space.low, np.float64).reshape(space.shape), actions.shape)
    high = np.broadcast_to(np.asarray(space.high, np.float64).reshape(space.shape), actions.shape)
    x = actions.astype(np.float64)
    below = np.where(np.isfinite(low), low - x - _BOUND_TOL * np.maximum(1.0, np.abs(low)), -1.0)
    above = np.where(np.isfinite(high), x - high - _BOUND_TOL * np.maximum(1.0, np.abs(high)), -1.0)
    if max(float(below.max(initial=-1.0)), float(above.max(initial=-1.0))) <= 0:
        return
    # name the single worst value, so the message points at a dimension and a bound
    side, excess = ("low", below) if below.max() >= above.max() else ("high", above)
    row, *dims = np.unravel_index(int(np.argmax(excess)), excess.shape)
    index = tuple(int(d) for d in dims)
    bound = (low if side == "low" else high)[(row, *index)]
    outside = int(np.sum((below > 0) | (above > 0)))
    at = f"row {row}" + (f", dimension {index[0] if len(index) == 1 else index}" if index else "")
    _fail(
        who,
        f"{where}: action {float(x[(row, *index)]):.6g} at {at} is "
        f"{'below' if side == 'low' else 'above'} the box's {side} bound {bound:.6g} "
        f"({outside} of {x.size} values outside [low, high]). Actions go to the env as they "
        f"are: clip (or squash) them into the action space's bounds before returning them.",
    )


def _check_predict(agent: Any, info: EnvInfo, obs: Any, who: str) -> None:
    """predict() takes any batch size (evaluation uses its own env count) and is greedy (two
    evaluations that start on the same observations act alike)."""
    first = _greedy(agent, obs)
    n = batch_size(obs)
    _check_actions(first, info, n, f"predict() on {n} observations", who, in_bounds=True)
    _close(
        who, "predict() twice on the same observations", _greedy(agent, obs), first, rtol=0, atol=0
    )
