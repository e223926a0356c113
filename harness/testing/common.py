"""What the conformance checks share: failing with the component named, tolerant comparisons,
random observations and actions for a space, per-agent views of multi-agent values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np

from harness.api import EnvInfo, SpaceInfo


def _fail(who: str, what: str) -> NoReturn:
    raise AssertionError(f"{who}: {what}")


def _check(condition: bool, who: str, what: str) -> None:
    if not condition:
        _fail(who, what)


def _close(
    who: str, what: str, actual: Any, expected: Any, *, rtol: float = 1e-5, atol: float = 1e-5
) -> None:
    """``actual`` (array-like, or an agent-keyed dict of them) equals ``expected`` within
    tolerance, shape included."""
    if isinstance(expected, Mapping):
        _check(
            isinstance(actual, Mapping) and set(actual) == set(expected),
            who,
            f"{what}: agents {sorted(actual) if isinstance(actual, Mapping) else actual!r}, "
            f"expected {sorted(expected)}",
        )
        for key in expected:
            _close(who, f"{what} [{key}]", actual[key], expected[key], rtol=rtol, atol=atol)
        return
    a = np.asarray(actual)
    e = np.asarray(expected)
    _check(a.shape == e.shape, who, f"{what}: shape {a.shape}, expected {e.shape}")
    if not np.allclose(a, e, rtol=rtol, atol=atol):
        diff = float(np.max(np.abs(a.astype(np.float64) - e.astype(np.float64))))
        _fail(who, f"{what}: values differ from the reference (max abs diff {diff:.3g})")


def _owner(plugin: str) -> str:
    return f" (plugin {plugin!r})" if plugin else ""


def _bounded(info: SpaceInfo) -> tuple[np.ndarray, np.ndarray]:
    """Finite sampling bounds for a box: its own where finite, a unit range elsewhere."""
    low = np.asarray(info.low, np.float64).reshape(info.shape)
    high = np.asarray(info.high, np.float64).reshape(info.shape)
    lo = np.where(np.isfinite(low), low, np.where(np.isfinite(high), high - 1.0, -1.0))
    hi = np.where(np.isfinite(high), high, lo + 2.0)
    return lo, hi


def random_actions(info: SpaceInfo, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Valid random actions for ``batch`` envs of the action space ``info``."""
    if info.kind == "discrete":
        return rng.integers(0, info.n, size=batch).astype(info.dtype)
    lo, hi = _bounded(info)
    x = rng.uniform(lo, hi, size=(batch, *info.shape))
    return np.clip(x, lo, hi).astype(info.dtype)


def random_observations(info: SpaceInfo, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Plausible observations: uniform within small finite bounds, else standard normal
    clipped to the bounds (CartPole's +-3.4e38 'bounds' would only produce overflow)."""
    if info.kind == "discrete":
        return rng.integers(0, info.n, size=batch).astype(info.dtype)
    shape = (batch, *info.shape)
    if not info.low:  # bounds not given: unbounded
        return rng.standard_normal(shape).astype(info.dtype)
    low = np.asarray(info.low, np.float64).reshape(info.shape)
    high = np.asarray(info.high, np.float64).reshape(info.shape)
    if np.issubdtype(np.dtype(info.dtype), np.integer):
        return rng.integers(low.astype(np.int64), high.astype(np.int64) + 1, size=shape).astype(
            info.dtype
        )
    small = np.isfinite(low) & np.isfinite(high) & (high - low <= 1e3)
    x = np.where(small, rng.uniform(np.where(small, low, 0), np.where(small, high, 1), shape), 0)
    x = np.where(small, x, np.clip(rng.standard_normal(shape), low, high))
    return x.astype(info.dtype)


def _obs_batch(info: EnvInfo, batch: int, rng: np.random.Generator) -> Any:
    """Random observations for ``batch`` envs: an array, or one per agent (multi-agent)."""
    if info.multi_agent:
        return {a: random_observations(info.observations[a], batch, rng) for a in info.agents}
    return random_observations(info.observation, batch, rng)


def _action_batch(info: EnvInfo, batch: int, rng: np.random.Generator) -> Any:
    """Valid random actions for ``batch`` envs: an array, or one per agent (multi-agent)."""
    if info.multi_agent:
        return {a: random_actions(info.actions[a], batch, rng) for a in info.agents}
    return random_actions(info.action, batch, rng)


def _agent_spaces(info: EnvInfo, which: str) -> dict[str, SpaceInfo]:
    """``{agent: space}`` (``which`` = "observations" or "actions"); a single-agent env's one
    space under the key ""."""
    if info.multi_agent:
        return dict(getattr(info, which))
    return {"": info.observation if which == "observations" else info.action}


def _per_agent(x: Any, info: EnvInfo, what: str, who: str) -> dict[str, Any]:
    """``x`` split by agent like :func:`_agent_spaces` (a single-agent value under "")."""
    if not info.multi_agent:
        return {"": x}
    _check(
        isinstance(x, Mapping) and set(x) == set(info.agents),
        who,
        f"{what} must be a dict keyed by the env's agents {list(info.agents)}, got "
        f"{sorted(x) if isinstance(x, Mapping) else type(x).__name__}",
    )
    return dict(x)


def _named(what: str, agent: str) -> str:
    return f"{what} of agent {agent!r}" if agent else what


def _snapshot(weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.array(v, copy=True) for k, v in weights.items()}


def _same(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
