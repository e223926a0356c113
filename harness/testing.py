"""Conformance checks for plugin authors: call them from your own tests.

Each check exercises one registered component the way harness's runner uses it and raises
:class:`AssertionError` naming the component, its plugin and what is wrong; it returns ``None``
when the component conforms. No pytest needed (the fixtures in :mod:`harness.pytest_plugin`
are a convenience)::

    from harness.plugins import collect_registry, make_plugin_manager
    from harness.testing import check_algorithm, check_backend, check_env

    registry = collect_registry(make_plugin_manager(autoload=False, load=["my_plugin"]))
    check_env(registry.envs.get("my_family"), "MyEnv-v0")
    backend = registry.backends.get("torch").load(None)
    check_backend(backend)
    check_algorithm(registry.algorithms.get("my_algo"), backend, env_info)

The checks use only numpy and the component under test: they import no framework and no
environment library themselves.
"""

from __future__ import annotations

import inspect
import math
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from harness.api import Distribution, EnvInfo, SpaceInfo, Transition, batch_size
from harness.registry import AlgorithmSpec, EnvSpec, TransportSpec
from harness.runtime.spaces import env_info as read_env_info

__all__ = ["check_algorithm", "check_backend", "check_env", "check_transport"]

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


# ------------------------------------------------------------------------------------------
# Shared helpers


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


# ------------------------------------------------------------------------------------------
# Environments


def check_env(
    spec: EnvSpec,
    env_id: str,
    *,
    num_envs: int = 2,
    steps: int = 200,
    seed: int = 0,
    options: Any = None,
) -> None:
    """Check that ``spec`` builds ``env_id`` as a vector env harness's runner can drive.

    Builds it like the runner (``make_env(env_id, num_envs=, seed=, vector="sync",
    options=)``; ``options`` defaults to ``spec.config_cls()``) and checks: the single
    spaces exist and :func:`harness.runtime.spaces.env_info` reads them; ``reset`` and ``step``
    with random valid actions return arrays of the right shapes and dtypes, inside the
    observation space; SAME_STEP autoreset (the step that ends an episode returns the reset
    observation, with the true final one in ``infos["final_obs"]`` and the mask in
    ``infos["_final_obs"]``); and determinism (two envs reset with the same seed give identical
    trajectories for the same actions). At least one episode must end within ``steps`` vector
    steps so the autoreset contract is exercised: raise ``steps`` for long episodes.
    """
    who = f"env family {spec.name!r}{_owner(spec.plugin)} building {env_id!r}"
    _check(bool(spec.accepts(env_id)), who, f"accepts({env_id!r}) returned False")
    if options is None and spec.config_cls is not None:
        options = spec.config_cls()

    def make() -> Any:
        try:
            return spec.make_env(
                env_id, num_envs=num_envs, seed=seed, vector="sync", options=options
            )
        except Exception as exc:
            _fail(who, f"make_env raised {type(exc).__name__}: {exc}")

    envs = make()
    try:
        info = _check_env_spaces(envs, env_id, num_envs, who)
        rng = np.random.default_rng(seed)
        actions = [_action_batch(info, num_envs, rng) for _ in range(steps)]
        trajectory = _run_env(envs, info, actions, seed, who, strict=True)
    finally:
        envs.close()
    other = make()
    try:
        again = _run_env(other, info, actions, seed, who, strict=False)
    finally:
        other.close()
    for t, (first, second) in enumerate(zip(trajectory, again, strict=True)):
        for name in first:
            _check(
                np.array_equal(first[name], second[name]),
                who,
                f"not deterministic: two envs reset with seed={seed} and given the same actions "
                f"returned different {name} at step {t}. Seed every random generator from the "
                f"reset seed (gymnasium: super().reset(seed=seed), then use self.np_random).",
            )


def _check_env_spaces(envs: Any, env_id: str, num_envs: int, who: str) -> EnvInfo:
    attrs: tuple[str, ...] = ("single_observation_space", "single_action_space", "num_envs")
    if hasattr(envs, "single_observation_spaces"):  # a multi-agent vector env
        attrs = ("agents", "single_observation_spaces", "single_action_spaces", "num_envs")
    for attr in attrs:
        _check(
            hasattr(envs, attr),
            who,
            f"make_env returned {type(envs).__name__} without .{attr}; return a vector env "
            f"(gymnasium.vector.VectorEnv or the same interface)",
        )
    try:
        info = read_env_info(env_id, envs)
    except Exception as exc:
        _fail(who, f"harness.runtime.spaces.env_info failed: {exc}")
    _check(info.num_envs == num_envs, who, f"num_envs is {info.num_envs}, asked for {num_envs}")
    return info


def _run_env(
    envs: Any, info: EnvInfo, actions: list[np.ndarray], seed: int, who: str, *, strict: bool
) -> list[dict[str, np.ndarray]]:
    """Reset with ``seed`` and step through ``actions``, recording the trajectory; checks
    every return value when ``strict``."""
    spaces = _obs_spaces(envs)
    result = envs.reset(seed=seed)
    _check(
        isinstance(result, tuple) and len(result) == 2,
        who,
        "reset(seed=...) must return (obs, infos)",
    )
    obs, infos = result
    if strict:
        _check_obs_batch(obs, info, spaces, "reset", who)
        _check(isinstance(infos, Mapping), who, f"reset returned infos of type {type(infos)}")
    trajectory = [_flat_record({"reset obs": obs})]
    episodes_ended = 0
    for t, action in enumerate(actions):
        out = envs.step(action)
        _check(
            isinstance(out, tuple) and len(out) == 5,
            who,
            "step must return (obs, rewards, terminated, truncated, infos)",
        )
        if strict:
            _check_step(out, info, spaces, f"step {t}", who)
            episodes_ended += int(np.sum(out[2] | out[3]))
        names = ("obs", "rewards", "terminated", "truncated")
        trajectory.append(_flat_record(dict(zip(names, out, strict=False))))
    if strict:
        _check(
            episodes_ended > 0,
            who,
            f"no episode ended within {len(actions)} steps of {info.num_envs} envs under random "
            f"actions, so the autoreset contract went unchecked; pass a larger steps=",
        )
    return trajectory


def _obs_spaces(envs: Any) -> dict[str, Any]:
    """The env's observation space(s) by agent ("" for a single-agent env)."""
    spaces = getattr(envs, "single_observation_spaces", None)
    return dict(spaces) if spaces is not None else {"": envs.single_observation_space}


def _flat_record(values: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Copies of a step's values, agent-keyed dicts flattened to ``name[agent]`` entries."""
    out: dict[str, np.ndarray] = {}
    for name, value in values.items():
        if isinstance(value, Mapping):
            out.update({f"{name}[{a}]": np.array(v, copy=True) for a, v in value.items()})
        else:
            out[name] = np.array(value, copy=True)
    return out


def _check_obs_batch(
    obs: Any, info: EnvInfo, spaces: Mapping[str, Any], where: str, who: str
) -> None:
    n = info.num_envs
    by_agent = _per_agent(obs, info, f"{where}: obs", who)
    for agent, expected in _agent_spaces(info, "observations").items():
        x = by_agent[agent]
        what = _named(f"{where}: obs", agent)
        _check(isinstance(x, np.ndarray), who, f"{what} is {type(x).__name__}, not ndarray")
        want = (n, *expected.shape)
        _check(x.shape == want, who, f"{what} shape {x.shape}, expected {want}")
        dtype = np.dtype(expected.dtype)
        _check(x.dtype == dtype, who, f"{what} dtype {x.dtype}, expected {dtype}")
        for i in range(n):
            _check_in_space(x[i], spaces[agent], f"{what}, env {i}", who)


def _check_in_space(x: Any, space: Any, what: str, who: str) -> None:
    contains: Callable[[Any], bool] | None = getattr(space, "contains", None)
    if contains is not None:
        _check(bool(contains(x)), who, f"{what} is outside the observation space {space}")


def _check_step(
    out: tuple[Any, ...], info: EnvInfo, spaces: Mapping[str, Any], where: str, who: str
) -> None:
    obs, rewards, terminated, truncated, infos = out
    n = info.num_envs
    _check_obs_batch(obs, info, spaces, where, who)
    checks = [
        (_named(f"{where}: rewards", agent), x, "fiu")
        for agent, x in _per_agent(rewards, info, f"{where}: rewards", who).items()
    ]
    checks += [(f"{where}: terminated", terminated, "b"), (f"{where}: truncated", truncated, "b")]
    for what, x, kinds in checks:
        _check(isinstance(x, np.ndarray), who, f"{what} is {type(x).__name__}")
        _check(x.shape == (n,), who, f"{what} shape {x.shape}, expected {(n,)} (one per env)")
        _check(x.dtype.kind in kinds, who, f"{what} has dtype {x.dtype}")
        if what.startswith(f"{where}: rewards"):
            _check(bool(np.all(np.isfinite(x))), who, f"{what}: non-finite rewards {x}")
    _check(isinstance(infos, Mapping), who, f"{where}: infos is {type(infos).__name__}")
    done = terminated | truncated
    if done.any():
        _check_final_obs(infos, done, info, spaces, where, who)


def _check_final_obs(
    infos: Mapping[str, Any],
    done: np.ndarray,
    info: EnvInfo,
    spaces: Mapping[str, Any],
    where: str,
    who: str,
) -> None:
    _check(
        "final_obs" in infos and "_final_obs" in infos,
        who,
        f"{where}: an episode ended but infos has no 'final_obs'/'_final_obs'. harness needs "
        f"SAME_STEP autoreset (gymnasium: autoreset_mode=AutoresetMode.SAME_STEP): the ending "
        f"step returns the reset obs and puts the true final obs in infos['final_obs']",
    )
    mask = np.asarray(infos["_final_obs"])
    _check(
        mask.shape == done.shape and np.array_equal(mask.astype(bool), done),
        who,
        f"{where}: infos['_final_obs'] = {mask} does not match terminated | truncated = {done}",
    )
    finals = _per_agent(infos["final_obs"], info, f"{where}: infos['final_obs']", who)
    for agent, expected in _agent_spaces(info, "observations").items():
        for i in np.flatnonzero(done):
            final = np.asarray(finals[agent][i])
            what = _named(f"{where}: final_obs[{i}]", agent)
            want = expected.shape
            _check(final.shape == want, who, f"{what} shape {final.shape} != {want}")
            _check_in_space(final, spaces[agent], what, who)


# ------------------------------------------------------------------------------------------
# Backends


def check_backend(backend: Any) -> None:
    """Check every method of :class:`harness.api.Backend` numerically against numpy.

    Covers models (``mlp`` shapes, flattening, activations, ``activate_output``, ``out_gain``,
    ``group``), tensors and arithmetic, ``gather``/``clip``/``minimum``/``maximum``/``exp``,
    reductions with an axis, elementwise ``mse``/``smooth_l1``, categorical and normal
    distributions, optimisers (a regression loss goes down, ``update`` returns the pre-clip
    norm, ``set_lr``), ``copy_weights`` (hard and Polyak), weights and state round trips,
    ``save``/``load`` through a temporary directory, and seeding/RNG-state reproducibility.
    The ``cnn`` trunk too: output shape, uint8 frames, input scaling, training steps.
    Reseeds the backend's global RNG as a side effect.
    """
    name = getattr(backend, "name", None)
    who = f"backend {name!r}"
    _check(isinstance(name, str) and bool(name), who, "needs a non-empty str attribute .name")
    _check(isinstance(getattr(backend, "device", None), str), who, "needs a str .device")
    rng = np.random.default_rng(0)
    backend.seed(0)
    for part in (
        _check_tensors,
        _check_ops,
        _check_losses,
        _check_models,
        _check_distributions,
        _check_training,
        _check_frozen,
        _check_weight_copies,
        _check_state,
        _check_rng,
    ):
        part(backend, rng, who)


def _np(bk: Any, x: Any) -> np.ndarray:
    return np.asarray(bk.numpy(x))


def _check_tensors(bk: Any, rng: np.random.Generator, who: str) -> None:
    x = rng.standard_normal((3, 4)).astype(np.float32)
    back = bk.numpy(bk.tensor(x))
    _check(isinstance(back, np.ndarray), who, f"numpy() returned {type(back).__name__}")
    _check(back.dtype == np.float32, who, f"tensor(float32).numpy() has dtype {back.dtype}")
    _close(who, "tensor/numpy round trip", back, x, rtol=0, atol=0)
    idx = np.array([2, 0, 1], np.int64)
    back_i = _np(bk, bk.tensor(idx, "int64"))
    _check(back_i.dtype == np.int64, who, f"tensor(x, 'int64') round trip gave {back_i.dtype}")
    _check(np.array_equal(back_i, idx), who, "tensor(x, 'int64') round trip changed the values")
    flags = _np(bk, bk.tensor(np.array([True, False, True])))
    _close(who, "tensor(bool array) as float32", flags, [1.0, 0.0, 1.0], atol=0)
    scalar = bk.tensor(2.5)
    _close(who, "tensor(2.5)", _np(bk, scalar), np.float32(2.5), atol=0)
    item = bk.item(scalar)
    _check(isinstance(item, float) and item == 2.5, who, f"item(tensor(2.5)) returned {item!r}")
    a, b = bk.tensor(x), bk.tensor(x[::-1].copy())
    _close(who, "a * b + 1 - a / 2", _np(bk, a * b + 1.0 - a / 2.0), x * x[::-1] + 1 - x / 2)
    _close(who, "1 - 2 * a", _np(bk, 1.0 - 2.0 * a), 1 - 2 * x)
    _close(who, "-a", _np(bk, -a), -x)
    _close(who, "a[:, 0]", _np(bk, a[:, 0]), x[:, 0])
    _close(who, "a[:, None]", _np(bk, a[:, None]), x[:, None])
    with bk.no_grad():
        _close(who, "arithmetic inside no_grad()", _np(bk, a + b), x + x[::-1])


def _check_ops(bk: Any, rng: np.random.Generator, who: str) -> None:
    x = rng.standard_normal((4, 3)).astype(np.float32)
    y = rng.standard_normal((4, 3)).astype(np.float32)
    tx, ty = bk.tensor(x), bk.tensor(y)
    idx = np.array([2, 0, 1, 2], np.int64)
    _close(
        who, "gather(x, index)", _np(bk, bk.gather(tx, bk.tensor(idx, "int64"))), x[range(4), idx]
    )
    x3 = rng.standard_normal((2, 4, 3)).astype(np.float32)  # (batch, agents, actions): QMIX
    idx3 = np.array([[2, 0, 1, 2], [1, 1, 0, 2]], np.int64)
    _close(
        who,
        "gather(x, index) with two leading axes",
        _np(bk, bk.gather(bk.tensor(x3), bk.tensor(idx3, "int64"))),
        np.take_along_axis(x3, idx3[..., None], -1)[..., 0],
    )
    _close(who, "clip(x, -0.5, 0.3)", _np(bk, bk.clip(tx, -0.5, 0.3)), np.clip(x, -0.5, 0.3))
    _close(who, "minimum(a, b)", _np(bk, bk.minimum(tx, ty)), np.minimum(x, y))
    _close(who, "maximum(a, b)", _np(bk, bk.maximum(tx, ty)), np.maximum(x, y))
    _close(who, "exp(x)", _np(bk, bk.exp(tx)), np.exp(x))
    _close(who, "log(exp(x))", _np(bk, bk.log(bk.exp(tx))), x, atol=1e-5)
    _close(who, "tanh(x)", _np(bk, bk.tanh(tx)), np.tanh(x))
    big = bk.tensor(np.array([-100.0, -1.0, 0.0, 1.0, 100.0], np.float32))
    _close(
        who,
        "softplus(x) (stable for large |x|)",
        _np(bk, bk.softplus(big)),
        np.logaddexp(0.0, np.array([-100.0, -1.0, 0.0, 1.0, 100.0])),
        atol=1e-6,
    )
    for join in (0, 1, -1):
        _close(
            who,
            f"concat([a, b], axis={join})",
            _np(bk, bk.concat([tx, ty], axis=join)),
            np.concatenate([x, y], axis=join),
        )
    for axis in (None, 0, 1, -1):
        _close(who, f"mean(x, axis={axis})", _np(bk, bk.mean(tx, axis=axis)), x.mean(axis=axis))
        _close(who, f"sum(x, axis={axis})", _np(bk, bk.sum(tx, axis=axis)), x.sum(axis=axis))
    for axis in (0, 1, -1):
        _close(who, f"max(x, axis={axis})", _np(bk, bk.max(tx, axis=axis)), x.max(axis=axis))
        arg = _np(bk, bk.argmax(tx, axis=axis))
        _check(arg.dtype.kind in "iu", who, f"argmax(axis={axis}) has dtype {arg.dtype}")
        _check(
            np.array_equal(arg, x.argmax(axis=axis)),
            who,
            f"argmax(x, axis={axis}) = {arg}, expected {x.argmax(axis=axis)}",
        )


def _check_losses(bk: Any, rng: np.random.Generator, who: str) -> None:
    a = rng.uniform(-3, 3, 64).astype(np.float32)
    b = rng.uniform(-3, 3, 64).astype(np.float32)
    d = a - b
    huber = np.where(np.abs(d) < 1.0, 0.5 * d * d, np.abs(d) - 0.5)
    ta, tb = bk.tensor(a), bk.tensor(b)
    _close(who, "mse(a, b) (elementwise)", _np(bk, bk.mse(ta, tb)), d * d)
    _close(who, "smooth_l1(a, b) (elementwise, delta 1)", _np(bk, bk.smooth_l1(ta, tb)), huber)


def _forward(bk: Any, model: Any, x: np.ndarray) -> np.ndarray:
    with bk.no_grad():
        return _np(bk, model(bk.tensor(x)))


def _check_models(bk: Any, rng: np.random.Generator, who: str) -> None:
    x = rng.standard_normal((64, 3)).astype(np.float32)
    for activation in ("tanh", "relu", "elu"):
        out = _forward(bk, bk.mlp(3, [8, 8], 4, activation=activation), x)
        _check(out.shape == (64, 4), who, f"mlp(3, [8, 8], 4) gave shape {out.shape}")
        _check(bool(np.all(np.isfinite(out))), who, f"mlp({activation}) output is not finite")
    linear = _forward(bk, bk.mlp(3, [], 2), x)
    _check(linear.shape == (64, 2), who, f"mlp(3, [], 2) gave shape {linear.shape}")
    image = rng.standard_normal((5, 2, 3)).astype(np.float32)
    flat = _forward(bk, bk.mlp(6, [8], 2), image)
    _check(
        flat.shape == (5, 2),
        who,
        f"mlp(6, [8], 2) on a (5, 2, 3) batch gave {flat.shape}: models must flatten all axes "
        f"after the batch axis (algorithms size in_dim with SpaceInfo.flat_dim)",
    )
    plain = _forward(bk, bk.mlp(3, [8], 4, activation="relu"), x)
    trunk = _forward(bk, bk.mlp(3, [8], 4, activation="relu", activate_output=True), x)
    _check(bool(plain.min() < 0), who, "mlp(relu) output is never negative: output activated?")
    _check(bool(trunk.min() >= 0), who, "mlp(relu, activate_output=True) output is negative")
    small = np.abs(_forward(bk, bk.mlp(3, [16], 4, out_gain=0.01), x)).max()
    large = np.abs(_forward(bk, bk.mlp(3, [16], 4, out_gain=1.0), x)).max()
    _check(
        small < 0.1 * large,
        who,
        f"out_gain=0.01 gives outputs up to {small:.3g} vs {large:.3g} at out_gain=1: the "
        f"gain must scale the last layer's init (PPO relies on it for a near-uniform policy)",
    )
    _check_parallel_mlp(bk, x, who)
    _check_cnn(bk, rng, who)
    m1, m2 = bk.mlp(3, [8], 2), bk.mlp(3, [8], 1)
    g = bk.group(actor=m1, critic=m2)
    _close(who, "group(actor=m)['actor'](x)", _forward(bk, g["actor"], x), _forward(bk, m1, x))
    n_parts = len(bk.get_weights(m1)) + len(bk.get_weights(m2))
    _check(
        len(bk.get_weights(g)) == n_parts,
        who,
        f"get_weights(group) has {len(bk.get_weights(g))} arrays, its members {n_parts}",
    )


def _check_cnn(bk: Any, rng: np.random.Generator, who: str) -> None:
    """cnn: uint8 frames (B, C, H, W) in, (B, out_dim) ReLU features out, the input scaled
    inside, custom layers, a numpy inference copy, and a few steps of training."""
    frames = rng.integers(0, 256, size=(6, 2, 36, 36), dtype=np.uint8)
    net = bk.cnn((2, 36, 36), 16)
    with bk.no_grad():
        out = _np(bk, net(bk.tensor(frames, "uint8")))
        as_float = _np(bk, net(bk.tensor(frames.astype(np.float32))))
    _check(out.shape == (6, 16), who, f"cnn((2, 36, 36), 16) on 6 frames gave {out.shape}")
    _check(bool(np.all(np.isfinite(out))), who, "cnn output is not finite")
    _check(bool(out.min() >= 0.0), who, "cnn features are negative: the trunk ends in a ReLU")
    _close(who, "cnn on uint8 frames vs the same frames as float32", out, as_float, rtol=1e-4)
    unscaled = bk.cnn((2, 36, 36), 16, scale=1.0)
    bk.set_weights(unscaled, bk.get_weights(net))
    _close(
        who,
        "cnn(scale=1/255)(x) vs cnn(scale=1)(x / 255) with the same weights",
        _forward(bk, unscaled, frames.astype(np.float32) / 255.0),
        out,
        rtol=1e-4,
        atol=1e-4,
    )
    _close(who, "inference(cnn)(frames)", bk.inference(net)(frames), out, rtol=1e-4, atol=1e-4)
    small = bk.cnn((1, 20, 20), 8, channels=[4], kernels=[5], strides=[3])
    got = _forward(bk, small, rng.integers(0, 256, size=(3, 1, 20, 20)).astype(np.float32))
    _check(got.shape == (3, 8), who, f"cnn with one custom conv layer gave shape {got.shape}")
    opt = bk.optimizer(net, lr=1e-3)
    target = bk.tensor(np.ones((6, 16), np.float32))
    losses = []
    for _ in range(5):
        loss = bk.mean(bk.mse(net(bk.tensor(frames, "uint8")), target))
        losses.append(bk.item(loss))
        bk.update(opt, loss)
    _check(
        losses[-1] < losses[0],
        who,
        f"5 Adam steps on a cnn did not lower its regression loss ({losses[0]:.4g} -> "
        f"{losses[-1]:.4g}): its parameters do not train",
    )


def _check_parallel_mlp(bk: Any, x: np.ndarray, who: str) -> None:
    """parallel_mlp: one output per member, members independent, output gains per member."""
    net = bk.parallel_mlp(3, [16, 16], [4, 1], activation="tanh", out_gains=[0.01, 1.0])
    with bk.no_grad():
        outs = [_np(bk, o) for o in net(bk.tensor(x))]
    _check(len(outs) == 2, who, f"parallel_mlp with 2 members returned {len(outs)} outputs")
    _check(
        outs[0].shape == (64, 4) and outs[1].shape == (64, 1),
        who,
        f"parallel_mlp(3, [16, 16], [4, 1]) gave shapes {[o.shape for o in outs]}",
    )
    small, large = np.abs(outs[0]).max(), np.abs(outs[1]).max()
    _check(
        small < 0.1 * large,
        who,
        f"parallel_mlp out_gains [0.01, 1.0] give outputs up to {small:.3g} and {large:.3g}: "
        f"each member's output gain must scale its own last layer",
    )
    param = bk.parameter(np.zeros(3, np.float32))
    opt = bk.optimizer(net, lr=0.05)
    target = np.ones((64, 1), np.float32)
    for _ in range(5):  # training only the second member's loss must not move the first
        out = net(bk.tensor(x))
        bk.update(opt, bk.mean(bk.mse(out[1], bk.tensor(target))))
    with bk.no_grad():
        after = _np(bk, net(bk.tensor(x))[0])
    _close(who, "parallel_mlp member 0 after training only member 1", after, outs[0])
    with bk.no_grad():
        framework = [_np(bk, o) for o in net(bk.tensor(x))]
    numpy_copy = bk.inference(net)(x)
    for j in range(2):
        _close(who, f"inference(parallel_mlp)(x)[{j}]", numpy_copy[j], framework[j], rtol=1e-4)
    # one input per member: member j must see batch j only
    y = x[::-1].copy()
    with bk.no_grad():
        split = [_np(bk, o) for o in net([bk.tensor(x), bk.tensor(y)])]
        swapped = [_np(bk, o) for o in net(bk.tensor(y))]
    _close(who, "parallel_mlp([x, y])[0] (member 0 on x)", split[0], framework[0], rtol=1e-4)
    _close(who, "parallel_mlp([x, y])[1] (member 1 on y)", split[1], swapped[1], rtol=1e-4)
    split_np = bk.inference(net)([x, y])
    for j in range(2):
        _close(who, f"inference(parallel_mlp)([x, y])[{j}]", split_np[j], split[j], rtol=1e-4)
    for activation in ("tanh", "relu", "elu"):
        mlp = bk.mlp(3, [8, 8], 4, activation=activation)
        _close(
            who,
            f"inference(mlp({activation}))(x)",
            bk.inference(mlp)(x),
            _forward(bk, mlp, x),
            rtol=1e-4,
        )
    bk.assign(param, np.array([1.0, 2.0, 3.0], np.float32))
    _close(who, "assign(parameter, value)", _np(bk, param), np.array([1.0, 2.0, 3.0]))


def _check_distributions(bk: Any, rng: np.random.Generator, who: str) -> None:
    logits = rng.standard_normal((5, 4)).astype(np.float32)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    actions = np.array([0, 3, 1, 2, 3], np.int64)
    cat = bk.categorical(bk.tensor(logits))
    _check(isinstance(cat, Distribution), who, "categorical() lacks Distribution's methods")
    ta = bk.tensor(actions, "int64")
    _close(who, "categorical.log_prob", _np(bk, cat.log_prob(ta)), log_p[range(5), actions])
    _close(who, "categorical.entropy", _np(bk, cat.entropy()), -(np.exp(log_p) * log_p).sum(-1))
    mode = _np(bk, cat.mode())
    _check(np.array_equal(mode, logits.argmax(-1)), who, f"categorical.mode() = {mode}")
    probs = np.array([0.6, 0.3, 0.1])
    many = np.tile(np.log(probs).astype(np.float32), (4000, 1))
    draws = _np(bk, bk.categorical(bk.tensor(many)).sample())
    _check(draws.shape == (4000,), who, f"categorical.sample() shape {draws.shape}, not (4000,)")
    _check(draws.dtype.kind in "iu", who, f"categorical.sample() dtype {draws.dtype}")
    _check(bool(np.all((draws >= 0) & (draws < 3))), who, "categorical.sample() out of [0, n)")
    freq = np.bincount(draws, minlength=3) / len(draws)
    _close(who, "categorical.sample() frequencies", freq, probs, rtol=0, atol=0.05)

    mean = rng.standard_normal((5, 3)).astype(np.float32)
    log_std = rng.uniform(-1, 0.5, 3).astype(np.float32)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    z = (x - mean) / np.exp(log_std)
    ref_lp = (-0.5 * z * z - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
    ref_h = np.broadcast_to(log_std + 0.5 * (1 + np.log(2 * np.pi)), mean.shape).sum(-1)
    normal = bk.normal(bk.tensor(mean), bk.parameter(log_std))
    _close(
        who,
        "normal.log_prob (summed over action dims)",
        _np(bk, normal.log_prob(bk.tensor(x))),
        ref_lp,
    )
    _close(who, "normal.entropy (summed over action dims)", _np(bk, normal.entropy()), ref_h)
    _close(who, "normal.mode()", _np(bk, normal.mode()), mean)
    centre = np.tile(np.array([[1.0, -2.0]], np.float32), (4000, 1))
    spread = np.log(np.array([0.5, 2.0], np.float32))
    with bk.no_grad():
        s = _np(bk, bk.normal(bk.tensor(centre), bk.tensor(spread)).sample())
    _check(s.shape == (4000, 2), who, f"normal.sample() shape {s.shape}, expected (4000, 2)")
    _close(who, "normal.sample() mean", s.mean(0), [1.0, -2.0], rtol=0, atol=0.15)
    _close(who, "normal.sample() std", s.std(0), [0.5, 2.0], rtol=0.1, atol=0)


def _mean_loss(bk: Any, model: Any, x: np.ndarray, y: np.ndarray) -> Any:
    return bk.mean(bk.mse(model(bk.tensor(x))[:, 0], bk.tensor(y)))


def _check_training(bk: Any, rng: np.random.Generator, who: str) -> None:
    x = rng.standard_normal((64, 3)).astype(np.float32)
    y = (x @ np.array([0.5, -1.0, 2.0]) + 0.5).astype(np.float32)
    model = bk.mlp(3, [16], 1)
    opt = bk.optimizer(model, lr=3e-2, eps=1e-8)
    first = bk.item(_mean_loss(bk, model, x, y))
    for _ in range(100):
        norm = bk.update(opt, _mean_loss(bk, model, x, y))
    last = bk.item(_mean_loss(bk, model, x, y))
    _check(
        last < 0.2 * first,
        who,
        f"100 Adam steps on a linear regression took the loss from {first:.4g} to only "
        f"{last:.4g}: optimizer()/update() do not train the model",
    )
    _check(isinstance(norm, float) and math.isfinite(norm), who, f"update() returned {norm!r}")

    param = bk.parameter(np.zeros(3, np.float32))
    opt_p = bk.optimizer(param, lr=0.1)
    norm = bk.update(
        opt_p, bk.sum(param * bk.tensor(np.array([3, 4, 0], np.float32))), max_grad_norm=0.5
    )
    _close(who, "update(max_grad_norm=0.5) return value (the pre-clip norm)", norm, 5.0)
    _check(bool(np.any(_np(bk, param) != 0)), who, "update() did not move a parameter()")

    opt_both = bk.optimizer(model, param, lr=0.05)
    before = _snapshot(bk.get_weights(model)), _np(bk, param).copy()
    bk.set_lr(opt_both, 0.0)
    bk.update(opt_both, _mean_loss(bk, model, x, y) + bk.sum(param * param + param))
    _check(
        _same(before[0], bk.get_weights(model)) and np.array_equal(before[1], _np(bk, param)),
        who,
        "after set_lr(optimizer, 0.0), update() still changed the weights",
    )
    bk.set_lr(opt_both, 0.05)
    bk.update(opt_both, _mean_loss(bk, model, x, y) + bk.sum(param * param + param))
    _check(
        not _same(before[0], bk.get_weights(model))
        and not np.array_equal(before[1], _np(bk, param)),
        who,
        "optimizer(model, parameter) did not update both after set_lr(optimizer, 0.05)",
    )


def _check_frozen(bk: Any, rng: np.random.Generator, who: str) -> None:
    """frozen(m): m's parameters get no gradient, what feeds m still does (an actor trained
    through a critic)."""
    x = rng.standard_normal((32, 3)).astype(np.float32)
    trunk, head = bk.mlp(3, [8], 4), bk.mlp(4, [8], 1)
    opt = bk.optimizer(trunk, head, lr=0.05)
    before_trunk, before_head = _snapshot(bk.get_weights(trunk)), _snapshot(bk.get_weights(head))
    with bk.frozen(head):
        loss = bk.mean(head(trunk(bk.tensor(x))))
    bk.update(opt, loss)
    _check(
        _same(bk.get_weights(head), before_head),
        who,
        "frozen(head): an update through head still changed head's weights",
    )
    _check(
        not _same(bk.get_weights(trunk), before_trunk),
        who,
        "frozen(head): no gradient reached the trunk that feeds head",
    )
    bk.update(opt, bk.mean(head(trunk(bk.tensor(x)))))  # thawed again after the block
    _check(
        not _same(bk.get_weights(head), before_head),
        who,
        "head's weights stayed frozen after the frozen() block",
    )


def _snapshot(weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.array(v, copy=True) for k, v in weights.items()}


def _same(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _check_weight_copies(bk: Any, rng: np.random.Generator, who: str) -> None:
    x = rng.standard_normal((16, 3)).astype(np.float32)

    def net() -> Any:
        return bk.group(trunk=bk.mlp(3, [8], 8, activate_output=True), head=bk.mlp(8, [], 2))

    def run(g: Any) -> np.ndarray:
        with bk.no_grad():
            return _np(bk, g["head"](g["trunk"](bk.tensor(x))))

    source, target, polyak = net(), net(), net()
    ws = _snapshot(bk.get_weights(source))
    wt = _snapshot(bk.get_weights(polyak))
    _check(not _same(ws, wt), who, "two mlp()s built in a row have identical weights")
    bk.copy_weights(target, source)
    _close(who, "copy_weights(tau=1) then forward", run(target), run(source), rtol=0, atol=0)
    bk.copy_weights(polyak, source, tau=0.25)
    after = bk.get_weights(polyak)
    for key in ws:
        _close(
            who, f"copy_weights(tau=0.25) on {key!r}", after[key], 0.25 * ws[key] + 0.75 * wt[key]
        )

    weights = bk.get_weights(source)
    _check(
        all(isinstance(v, np.ndarray) for v in weights.values()),
        who,
        "get_weights() values must be numpy arrays",
    )
    expected = run(source)
    for v in weights.values():
        v += 1.0
    _close(
        who, "forward after editing get_weights() output (must be a copy)", run(source), expected
    )
    fresh = net()
    bk.set_weights(fresh, ws)
    for v in ws.values():
        v += 1.0
    _close(who, "set_weights(get_weights()) then forward", run(fresh), expected)


def _check_state(bk: Any, rng: np.random.Generator, who: str) -> None:
    x = rng.standard_normal((32, 3)).astype(np.float32)
    y = rng.standard_normal(32).astype(np.float32)
    a, b = bk.mlp(3, [8], 1), bk.mlp(3, [8], 1)
    bk.load_state(b, bk.state(a))
    _close(
        who, "load_state(model, state(other)) then forward", _forward(bk, b, x), _forward(bk, a, x)
    )
    param = bk.parameter(np.array([0.5, -1.0], np.float32))
    other = bk.parameter(np.zeros(2, np.float32))
    bk.load_state(other, bk.state(param))
    _close(who, "load_state(parameter, state(parameter))", _np(bk, other), [0.5, -1.0])

    opt_a = bk.optimizer(a, lr=1e-2)
    for _ in range(3):
        bk.update(opt_a, _mean_loss(bk, a, x, y))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"agent.{bk.name}"
        payload = {"model": bk.state(a), "optimizer": bk.state(opt_a), "n": 3, "arr": y}
        bk.save(payload, path)
        loaded = bk.load(path)
    _check(isinstance(loaded, dict), who, f"load() returned {type(loaded).__name__}, not dict")
    _check(loaded.get("n") == 3, who, "save()/load() lost a plain int in the payload")
    _close(who, "save()/load() of a numpy array", loaded.get("arr"), y, rtol=0, atol=0)
    opt_b = bk.optimizer(b, lr=1e-2)
    bk.load_state(b, loaded["model"])
    bk.load_state(opt_b, loaded["optimizer"])
    bk.update(opt_a, _mean_loss(bk, a, x, y))
    bk.update(opt_b, _mean_loss(bk, b, x, y))
    _close(
        who,
        "one more step after save/load of model + optimizer state (Adam moments restored?)",
        _forward(bk, b, x),
        _forward(bk, a, x),
    )


def _draws(bk: Any) -> tuple[np.ndarray, np.ndarray]:
    with bk.no_grad():
        cat = bk.categorical(bk.tensor(np.zeros((100, 4), np.float32))).sample()
        normal = bk.normal(
            bk.tensor(np.zeros((100, 2), np.float32)), bk.tensor(np.zeros(2))
        ).sample()
    return _np(bk, cat), _np(bk, normal)


def _check_rng(bk: Any, rng: np.random.Generator, who: str) -> None:
    bk.seed(7)
    w1 = _snapshot(bk.get_weights(bk.mlp(4, [8], 3)))
    d1 = _draws(bk)
    bk.seed(7)
    w2 = _snapshot(bk.get_weights(bk.mlp(4, [8], 3)))
    d2 = _draws(bk)
    _check(_same(w1, w2), who, "seed(7) twice gave different mlp() initial weights")
    _check(
        all(np.array_equal(p, q) for p, q in zip(d1, d2, strict=True)),
        who,
        "seed(7) twice gave different samples",
    )
    bk.seed(8)
    d3 = _draws(bk)
    _check(not np.array_equal(d1[1], d3[1]), who, "seed(7) and seed(8) gave the same samples")
    state = bk.rng_state()
    first = _draws(bk)
    bk.set_rng_state(state)
    second = _draws(bk)
    _check(
        all(np.array_equal(p, q) for p, q in zip(first, second, strict=True)),
        who,
        "set_rng_state(rng_state()) did not replay the same samples",
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rng"
        bk.save({"rng": state}, path)
        bk.set_rng_state(bk.load(path)["rng"])
    third = _draws(bk)
    _check(
        all(np.array_equal(p, q) for p, q in zip(first, third, strict=True)),
        who,
        "an rng_state() that went through save()/load() did not replay the same samples",
    )


# ------------------------------------------------------------------------------------------
# Algorithms


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
    ``[0, n)``; ``predict`` within the box bounds, for any batch size, deterministic);
    ``learn`` returns finite floats under namespaced keys (``losses/...``); learning changes
    ``weights()`` within ``steps``; ``save`` then ``restore`` into a new agent reproduces its
    weights, ``predict`` and ``sample`` (RNG and counters included); and ``weights()`` /
    ``set_weights()`` carry the policy to a fresh agent.
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
    _check_predict(agent, env_info, odd_batch, who)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "checkpoint"
        agent.save(directory)
        expected = _samples(agent, probe), agent.predict(odd_batch), _snapshot(agent.weights())
        restored = make(seed + 1)
        restored.restore(directory)
        actual = _samples(restored, probe), restored.predict(odd_batch), restored.weights()
    _check(_same(expected[2], actual[2]), who, "restore(save()) gave different weights()")
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
    fresh = make(seed + 2)
    weights = agent.weights()
    _check(
        all(isinstance(k, str) and isinstance(v, np.ndarray) for k, v in weights.items()),
        who,
        "weights() must map str names to numpy arrays",
    )
    fresh.set_weights(weights)
    _check(_same(fresh.weights(), weights), who, "set_weights(w) then weights() differs from w")
    _close(
        who,
        "predict() after set_weights(weights())",
        fresh.predict(odd_batch),
        agent.predict(odd_batch),
        rtol=1e-6,
        atol=1e-6,
    )


def _samples(agent: Any, obs: Any, draws: int = 8) -> Any:
    """Several sample() calls in a row, so a lucky match of random actions is unlikely."""
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
    before = _snapshot(agent.weights())
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
    _check_actions(actions, info, n, where, who, in_bounds=False)
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
    if in_bounds:
        low = np.asarray(space.low, np.float64).reshape(space.shape)
        high = np.asarray(space.high, np.float64).reshape(space.shape)
        inside = np.all((actions >= low) & (actions <= high))
        _check(bool(inside), who, f"{where}: actions outside the box [{low}, {high}]")


def _check_predict(agent: Any, info: EnvInfo, obs: Any, who: str) -> None:
    """predict() takes any batch size (evaluation uses its own env count) and is greedy."""
    first = agent.predict(obs)
    n = batch_size(obs)
    _check_actions(first, info, n, f"predict() on {n} observations", who, in_bounds=True)
    _close(
        who, "predict() twice on the same observations", agent.predict(obs), first, rtol=0, atol=0
    )


# ------------------------------------------------------------------------------------------
# Transports


class ConformanceActor:
    """The class :func:`check_transport` runs remotely (importable wherever harness is)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def echo(self, x: Any) -> Any:
        return x

    def add(self, a: int, b: int = 0) -> int:
        return self.value + a + b

    def double(self, array: np.ndarray) -> np.ndarray:
        return array * 2

    def fail(self, message: str) -> None:
        raise ValueError(message)


def check_transport(spec: TransportSpec, address: Any = None, **options: Any) -> None:
    """Check a transport against the remote-object contract of :mod:`harness.remote`.

    ``spec.connect(address, **options)`` must return a :class:`harness.remote.Client`; the
    check creates a :class:`ConformanceActor` through it and verifies blocking calls, keyword
    arguments, futures, attribute reads, numpy arrays (dtype, shape, values; writable, or a
    read-only zero-copy view that refuses writes),
    ``RemoteError`` for a remote exception, that a released actor no longer answers, and that
    ``close()`` works twice. ``address``/``options`` are whatever your ``connect`` takes
    (``None`` asks for its local default). It starts real actors, so it takes seconds."""
    from harness.errors import HarnessError
    from harness.remote import ActorOptions, Proxy, RemoteClass, RemoteError, release

    who = f"transport {spec.name!r}{_owner(spec.plugin)}"
    _check(bool(spec.name), who, "TransportSpec.name is empty")
    _check(callable(spec.connect), who, f"TransportSpec.connect is {spec.connect!r}, not callable")
    try:
        signature = inspect.signature(spec.connect)
    except (TypeError, ValueError):  # some builtins have no signature: just call it
        signature = None
    if signature is not None:
        try:
            signature.bind(address, **options)
        except TypeError as exc:
            _fail(who, f"connect(address, **options) does not accept those arguments: {exc}")
    client = spec.connect(address, **options)
    for method in ("create_actor", "close"):
        _check(
            callable(getattr(client, method, None)),
            who,
            f"connect() returned {type(client).__name__} without {method}() "
            f"(see harness.remote.Client)",
        )
    try:
        cls = RemoteClass(ConformanceActor, ActorOptions(cpus=0.5))
        actor = cls(10, _client=client)
        _check(isinstance(actor, Proxy), who, "creating a remote instance gave no Proxy")
        _check(actor.echo("x") == "x", who, "echo('x') did not return 'x'")
        _check(actor.add(1, b=2) == 13, who, "add(1, b=2) on value 10 did not return 13")
        _check(actor.value == 10, who, "reading the attribute 'value' did not return 10")
        futures = [actor.add.future(i) for i in range(20)]
        _check(
            [f.result(timeout=60) for f in futures] == [10 + i for i in range(20)],
            who,
            "futures did not return the results of their calls in order",
        )
        array = np.arange(300_000, dtype=np.float32).reshape(1000, 300)
        doubled = actor.double(array)
        _check(isinstance(doubled, np.ndarray), who, "a numpy result came back as another type")
        _close(who, "double(array)", doubled, array * 2, rtol=0, atol=0)
        _check(doubled.dtype == np.float32, who, f"dtype changed to {doubled.dtype}")
        if not doubled.flags.writeable:  # a zero-copy view (Ray's object store): then
            try:  # writing must fail loudly, never change memory others read
                doubled[0, 0] = -1.0
            except ValueError:
                pass
            else:
                _fail(who, "a read-only array from a remote call accepted a write")
        try:
            actor.fail("expected by check_transport")
        except RemoteError as exc:
            _check("ValueError" in exc.remote_type, who, f"remote_type is {exc.remote_type!r}")
            _check(
                "expected by check_transport" in exc.remote_message,
                who,
                f"remote_message is {exc.remote_message!r}",
            )
            _check(bool(exc.remote_traceback), who, "RemoteError carries no remote traceback")
        else:
            _fail(who, "a remote ValueError was not re-raised as harness.RemoteError")
        release(actor)
        try:
            actor.echo(1)
        except HarnessError:
            pass
        else:
            _fail(who, "an actor still answered after harness.release()")
    finally:
        client.close()
    client.close()  # idempotent
