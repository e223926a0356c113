"""check_env: an env plugin's vector envs as harness's runner drives them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import numpy as np

from harness.api import EnvInfo, SpaceInfo
from harness.registry import EnvSpec
from harness.runtime.spaces import env_info as read_env_info
from harness.runtime.stepper import EPISODE_METRICS
from harness.testing.common import (
    _action_batch,
    _agent_spaces,
    _check,
    _fail,
    _named,
    _owner,
    _per_agent,
)


def check_env(
    spec: EnvSpec,
    env_id: str,
    *,
    num_envs: int = 2,
    steps: int = 200,
    seed: int = 0,
    options: Any = None,
    render: bool = True,
) -> None:
    """Check that ``spec`` builds ``env_id`` as a vector env harness's runner can drive.

    Builds it like the runner (``make_env(env_id, num_envs=, seed=, vector="sync",
    options=)``; ``options`` defaults to ``spec.config_cls()``) and checks: the single
    spaces exist and :func:`harness.runtime.env_info` reads them; ``reset`` and ``step``
    with random valid actions return arrays of the right shapes and dtypes, inside the
    observation space; SAME_STEP autoreset (the step that ends an episode returns the reset
    observation, with the true final one in ``infos["final_obs"]`` and the mask in
    ``infos["_final_obs"]``), final observations of the space's dtype too (the sync vector env
    casts the batch, not ``final_obs``); ``info["episode_metrics"]`` of an ending step, if
    any, a dict of float scalars (what ``harness.runtime.run.episode_metrics`` reads);
    and determinism (two envs reset with the same seed give identical
    trajectories for the same actions). At least one episode must end within ``steps`` vector
    steps so the autoreset contract is exercised: raise ``steps`` for long episodes.

    A family that declares ``"rgb_array"`` in ``spec.render_modes`` also has its renderer
    checked (``harness.testing.env.check_renderer``) unless ``render=False`` (a slow
    renderer checked elsewhere).
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
    if render and "rgb_array" in spec.render_modes:
        check_renderer(spec, env_id, num_envs=num_envs, steps=steps, seed=seed, options=options)


def check_renderer(
    spec: EnvSpec,
    env_id: str,
    *,
    num_envs: int = 2,
    steps: int = 200,
    seed: int = 0,
    options: Any = None,
) -> None:
    """Check ``spec``'s ``rgb_array`` renderer (the render contract, docs/video.md):
    ``make_env(..., render_mode="rgb_array")`` gives a vector env whose ``render()`` after
    ``reset`` and after each step returns one ``(H, W, 3)`` uint8 frame per env, of one shape
    throughout, across an autoreset too (stepping stops two steps after the first episode
    ends, or fails after ``steps``); a final frame an ending step hands over
    (``info["final_frame"]``, optional) has that shape too; and a frame is not written into
    by later calls (the recorder keeps frames by reference: a new array per call, as
    gymnasium's renderers give, or one the env never writes into again)."""
    who = f"env family {spec.name!r}{_owner(spec.plugin)} rendering {env_id!r}"
    if options is None and spec.config_cls is not None:
        options = spec.config_cls()
    try:
        envs = spec.make_env(
            env_id,
            num_envs=num_envs,
            seed=seed,
            vector="sync",
            options=options,
            render_mode="rgb_array",
        )
    except Exception as exc:
        _fail(who, f"make_env(..., render_mode='rgb_array') raised {type(exc).__name__}: {exc}")
    try:
        info = _check_env_spaces(envs, env_id, num_envs, who)
        envs.reset(seed=seed)
        first = envs.render()
        shape = _check_frames(first, num_envs, None, "render() after reset", who)
        kept = [np.array(frame) for frame in first]  # (copies, to compare with later)
        rng = np.random.default_rng(seed)
        first_end = None
        for t in range(steps + 2):  # (the two steps after an episode ending at the last)
            out = envs.step(_action_batch(info, num_envs, rng))
            _check_frames(envs.render(), num_envs, shape, f"render() after step {t}", who)
            done = np.asarray(out[2]) | np.asarray(out[3])
            if done.any():
                _check_final_frames(out[4], done, shape, f"step {t}", who)
                first_end = t if first_end is None else first_end
            if first_end is not None and t >= first_end + 2:
                _check(
                    all(np.array_equal(a, b) for a, b in zip(first, kept, strict=True)),
                    who,
                    "the frames render() returned after the reset changed as the env stepped "
                    "and rendered again: return a new array per call (the recorder keeps "
                    "frames by reference, docs/video.md)",
                )
                return
            if first_end is None and t >= steps - 1:
                break
        _fail(
            who,
            f"no episode ended within {steps} steps under random actions, so rendering across "
            f"an autoreset went unchecked; pass a larger steps=",
        )
    finally:
        envs.close()


def _check_frames(
    frames: Any, n: int, shape: tuple[int, ...] | None, where: str, who: str
) -> tuple[int, ...]:
    """One (H, W, 3) uint8 frame per env, of ``shape`` when given; returns the shape."""
    _check(
        frames is not None and hasattr(frames, "__len__") and len(frames) == n,
        who,
        f"{where} returned {_short(frames)}: a vector env made with render_mode='rgb_array' "
        f"returns one frame per env ({n})",
    )
    for i, frame in enumerate(frames):
        what = f"{where}: frame of env {i}"
        _check(
            isinstance(frame, np.ndarray)
            and frame.ndim == 3
            and frame.shape[2] == 3
            and frame.dtype == np.uint8,
            who,
            f"{what} is {_type_name(frame)}, expected an (H, W, 3) uint8 array",
        )
        shape = shape or frame.shape
        _check(
            frame.shape == shape,
            who,
            f"{what} has shape {frame.shape} after frames of {shape}: keep one frame size "
            f"(a video needs it)",
        )
    assert shape is not None
    return shape


def _check_final_frames(
    infos: Mapping[str, Any], done: np.ndarray, shape: tuple[int, ...], where: str, who: str
) -> None:
    """The optional ``final_frame`` of ending steps: the frames' shape and dtype."""
    final = infos.get("final_info") if isinstance(infos, Mapping) else None
    if not isinstance(final, Mapping) or "final_frame" not in final:
        return
    mask = np.asarray(final.get("_final_frame", done), bool)
    for i in np.flatnonzero(done & mask):
        frame = final["final_frame"][i]
        _check(
            isinstance(frame, np.ndarray) and frame.shape == shape and frame.dtype == np.uint8,
            who,
            f"{where}: infos['final_info']['final_frame'][{i}] is {_type_name(frame)}, "
            f"expected a uint8 frame of shape {shape} like render()'s",
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
    try:
        result = envs.reset(seed=seed)
    except Exception as exc:
        _call_failed(envs, "reset(seed=...)", exc, spaces, who)
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
        try:
            out = envs.step(action)
        except Exception as exc:
            _call_failed(envs, f"step {t}", exc, spaces, who)
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


def _call_failed(
    envs: Any, call: str, exc: Exception, spaces: Mapping[str, Any], who: str
) -> NoReturn:
    """Fail naming what a reset or step raised; a vector env that could not stack its envs'
    observations (numpy's "Output array is the wrong shape") is named as an observation of
    the wrong shape, with the shapes."""
    what = f"{call} raised {type(exc).__name__}: {exc}"
    if isinstance(exc, ValueError) and "shape" in str(exc):
        shapes = {agent: getattr(space, "shape", None) for agent, space in spaces.items()}
        expected = shapes[""] if list(shapes) == [""] else shapes
        # gymnasium's SyncVectorEnv keeps its envs' observations of the failed step here
        seen = getattr(envs, "_env_obs", None)
        got = ""
        if isinstance(seen, list | tuple) and seen:
            got = f"; its envs returned observations shaped {[np.shape(o) for o in seen]}"
        what += (
            f". An observation has the wrong shape (the observation space is {expected}{got}): "
            "every observation must have the observation space's shape, all run long"
        )
    _fail(who, what)


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
        _check(x.dtype == dtype, who, f"{what} dtype {x.dtype}, {_dtype_fix(x.dtype, dtype)}")
        for i in range(n):
            _check_in_space(x[i], expected, spaces[agent], f"{what}, env {i}", who)


def _dtype_fix(got: np.dtype[Any], want: np.dtype[Any]) -> str:
    return (
        f"but the observation space says {want}: cast the observations in the env "
        f"(obs.astype(np.{want})) or declare the space with dtype=np.{got}"
    )


def _check_in_space(x: Any, expected: SpaceInfo, space: Any, what: str, who: str) -> None:
    # Checked before contains(): gymnasium's Box.contains rejects an array it cannot safely
    # cast (float64 for a float32 space) and the message would blame the values.
    want = np.dtype(expected.dtype)
    if isinstance(x, np.ndarray | np.generic) and not np.can_cast(x.dtype, want, "safe"):
        _fail(who, f"{what} has dtype {x.dtype}, {_dtype_fix(x.dtype, want)}")
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
        _check_episode_metrics(infos, done, where, who)


def _check_episode_metrics(
    infos: Mapping[str, Any], done: np.ndarray, where: str, who: str
) -> None:
    """``info["episode_metrics"]`` of the ending step, read where and as the runner reads it
    (harness.runtime.run.episode_metrics): a vector env merges it into
    ``infos["final_info"]["episode_metrics"]``, one array per name with ``_name`` masks."""
    final = infos.get("final_info")
    if not isinstance(final, Mapping) or EPISODE_METRICS not in final:
        return
    found = final[EPISODE_METRICS]
    rule = (
        f'info["{EPISODE_METRICS}"] on the step that ends an episode must be a dict of float '
        f"scalars (ints, bools and numpy scalars are fine)"
    )
    _check(
        isinstance(found, Mapping),
        who,
        f"{where}: {rule}; got {_type_name(found)} (infos['final_info']['{EPISODE_METRICS}'])",
    )
    mask = np.asarray(final.get("_" + EPISODE_METRICS, done), bool)
    for name, values in found.items():
        if name.startswith("_"):
            continue
        present = np.asarray(found.get("_" + name, mask), bool)
        for i in np.flatnonzero(done & mask & present):
            value = _env_value(values, int(i))
            _check(
                _is_float_scalar(value),
                who,
                f"{where}: {rule}; env {i} reported {EPISODE_METRICS}[{name!r}] = "
                f"{_short(value)} of type {_type_name(value)}. Report one number per name "
                f"(several numbers: one key each, e.g. '{name}/0', '{name}/1').",
            )


def _env_value(values: Any, i: int) -> Any:
    """Env ``i``'s entry of a merged info value (a nested dict is merged key by key)."""
    if isinstance(values, Mapping):
        return {k: _env_value(v, i) for k, v in values.items() if not str(k).startswith("_")}
    return values[i]


def _is_float_scalar(value: Any) -> bool:
    """What ``float(value)`` takes without surprise: a Python or numpy real number (a 0-d
    array too), not a string that happens to parse."""
    if isinstance(value, np.ndarray):
        return value.shape == () and value.dtype.kind in "biuf"
    if isinstance(value, np.generic):
        return value.dtype.kind in "biuf"
    return isinstance(value, int | float)


def _type_name(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"numpy.ndarray of shape {value.shape} and dtype {value.dtype}"
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
            raw = finals[agent][i]
            final = raw if isinstance(raw, np.ndarray) else np.asarray(raw)
            what = _named(f"{where}: final_obs[{i}]", agent)
            want = expected.shape
            _check(final.shape == want, who, f"{what} shape {final.shape} != {want}")
            _check_in_space(final, expected, spaces[agent], what, who)
