"""Five plugin-author mistakes the conformance checks of harness.testing catch, each as a
deliberately broken (mutant) component built from a real first-party one: a stale numpy acting
copy after set_weights or restore, non-float episode metrics, box actions outside the bounds,
float64 observations from a float32 space, and a recurrent sequence op that mishandles episode
starts, gates or gradients. The un-mutated first-party components pass the same checks in
test_conformance.py (every algorithm and backend, CartPole and Pendulum)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from test_conformance import (  # same directory: pytest puts it on sys.path
    BOX,
    DISCRETE,
    AgentProxy,
    BackendProxy,
    first_party,
)

from harness import numpy_nets, sequences
from harness.policy import Acting, Policy, State
from harness.pytest_plugin import cpu_backend
from harness.registry import AlgorithmSpec, EnvSpec
from harness.testing import check_algorithm, check_backend, check_env
from harness_algos import dqn

# ------------------------------------------------------------------------------------------
# 1. A stale acting copy: the weights change, the numpy copy that acting uses does not

ACTING_COPIES = ("_policy", "_log_std")
"""Where the first-party algorithms keep their numpy acting state (backend.inference)."""


def keeping_acting_copy(method: str) -> Callable[..., Any]:
    """``method`` (set_weights or restore) that updates the networks but puts the algorithm's
    acting copy back as it was: the mistake of forgetting to refresh it."""

    def call(agent: Any, *args: Any, **kwargs: Any) -> Any:
        state = vars(agent.algorithm)
        kept = {name: state[name] for name in ACTING_COPIES if name in state}
        result = getattr(agent, method)(*args, **kwargs)
        state.update(kept)
        return result

    return call


def mutant(name: str, **overrides: Callable[..., Any]) -> AlgorithmSpec:
    """The first-party algorithm ``name`` whose agents have some methods replaced."""
    real = first_party()[1].algorithms.get(name)

    def make_agent(*args: Any, **kwargs: Any) -> Any:
        return AgentProxy(real.make_agent(*args, **kwargs), **overrides)

    return AlgorithmSpec(
        f"broken_{name}",
        make_agent,
        real.config_cls,
        action_spaces=real.action_spaces,
        plugin="tests",
    )


# PPO takes its acting copy when built and after every weight change; TD3 drops it on a weight
# change and takes it lazily when it next acts, so its mistake shows only in an agent that
# had acted before (a farm actor acts, then receives the next weights).
STALE = {
    "ppo set_weights": ("ppo", DISCRETE, "set_weights", r"set_weights\(learner.weights\(\)\)"),
    "td3 set_weights": ("td3", BOX, "set_weights", r"set_weights\(learner.weights\(\)\)"),
    "ppo restore": ("ppo", BOX, "restore", r"restore\(directory\) of the learner.s save\(\)"),
    "td3 restore": ("td3", BOX, "restore", r"restore\(directory\) of the learner.s save\(\)"),
}


@pytest.mark.parametrize("case", STALE)
def test_check_algorithm_fails_on_a_stale_acting_copy(case: str, torch_backend: Any) -> None:
    name, info, method, how = STALE[case]
    spec = mutant(name, **{method: keeping_acting_copy(method)})
    with pytest.raises(AssertionError, match=f"after {how}, an agent that had already acted"):
        check_algorithm(spec, torch_backend, info, steps=1024)


def test_stale_acting_copy_message_says_what_to_do(torch_backend: Any) -> None:
    spec = mutant("td3", set_weights=keeping_acting_copy("set_weights"))
    with pytest.raises(AssertionError) as excinfo:
        check_algorithm(spec, torch_backend, BOX, steps=1024)
    message = str(excinfo.value)
    assert message.startswith("algorithm 'broken_td3' (plugin 'tests')")
    assert "acting exactly as before the new weights arrived" in message
    assert "backend.inference(model)" in message


# ------------------------------------------------------------------------------------------
# 2. Episode metrics that are not float scalars


def gym_family(*wrappers: Callable[[Any], Any]) -> EnvSpec:
    """gymnasium vector envs as the first-party family makes them (sync, SAME_STEP
    autoreset), each env wrapped in ``wrappers``."""

    def make_env(env_id: str, *, num_envs: int, **_: Any) -> Any:
        import gymnasium as gym

        return gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
            wrappers=list(wrappers),
        )

    return EnvSpec("wrapped", make_env, lambda env_id: True, plugin="tests")


def reporting(metrics: Any) -> Callable[[Any], Any]:
    """A wrapper whose env puts ``metrics`` in info["episode_metrics"] when an episode ends."""

    def wrap(env: Any) -> Any:
        import gymnasium as gym

        class EpisodeMetrics(gym.Wrapper):  # type: ignore[type-arg]
            def step(self, action: Any) -> Any:
                obs, reward, terminated, truncated, info = self.env.step(action)
                if terminated or truncated:
                    info = {**info, "episode_metrics": metrics}
                return obs, reward, terminated, truncated, info

        return EpisodeMetrics(env)

    return wrap


BAD_METRICS: dict[str, tuple[Any, str]] = {
    "a string": ({"score": 1.0, "grade": "high"}, r"\['grade'\] = 'high' of type str"),
    "an array": (
        {"score": np.array([1.0, 2.0])},
        r"\['score'\] = array\(\[1., 2.\]\) of type numpy.ndarray of shape \(2,\)",
    ),
    "a dict": ({"score": {"home": 1.0}}, r"\['score'\] = \{'home': .*\} of type dict"),
    "not a dict": (3.0, r"got numpy.ndarray of shape \(2,\) and dtype float64"),
}


@pytest.mark.parametrize("case", BAD_METRICS)
def test_check_env_fails_on_non_float_episode_metrics(case: str) -> None:
    metrics, detail = BAD_METRICS[case]
    with pytest.raises(AssertionError, match="must be a dict of float scalars") as excinfo:
        check_env(gym_family(reporting(metrics)), "CartPole-v1")
    assert excinfo.match(detail)


def test_check_env_accepts_numbers_the_runner_converts() -> None:
    """ints, bools and numpy scalars are what harness.runtime.run.episode_metrics turns into
    floats without trouble."""
    metrics = {"score": 2, "solved": True, "ratio": np.float32(0.5), "dist": np.int64(3)}
    check_env(gym_family(reporting(metrics)), "CartPole-v1")


# ------------------------------------------------------------------------------------------
# 3. Box actions outside the action space


def shifted(method: str, dim: int, value: float) -> Callable[..., Any]:
    """``method`` (sample or predict) with every action's dimension ``dim`` set to ``value``."""

    def call(agent: Any, obs: Any) -> Any:
        out = getattr(agent, method)(obs)
        actions = (out[0] if method == "sample" else out).copy()
        actions[:, dim] = value
        return (actions, out[1]) if method == "sample" else actions

    return call


def unclipped_sample(agent: Any, obs: Any) -> Any:
    """PPO's Gaussian sample as drawn, not clipped to the box (its rollout buffer keeps it)."""
    _, extras = agent.sample(obs)
    return extras["action"].astype(np.float32), extras


# BOX's action bounds: low (-2, 0), high (2, 1)
OUT_OF_BOUNDS: dict[str, tuple[AlgorithmSpec, str]] = {
    "predict above high": (
        mutant("td3", predict=shifted("predict", 1, 1.25)),
        r"predict\(\) on \d+ observations: action 1.25 at row 0, dimension 1 is above the "
        r"box's high bound 1 ",
    ),
    "sample below low": (
        mutant("ppo", sample=shifted("sample", 0, -2.5)),
        r"sample\(\) at step 0: action -2.5 at row 0, dimension 0 is below the box's low "
        r"bound -2 ",
    ),
    "sample unclipped": (
        mutant("ppo", sample=unclipped_sample),
        r"sample\(\) at step \d+: action -?[\d.]+ at row \d, dimension \d is (below|above) "
        r"the box's (low|high) bound",
    ),
}


@pytest.mark.parametrize("case", OUT_OF_BOUNDS)
def test_check_algorithm_fails_on_actions_outside_the_box(case: str, torch_backend: Any) -> None:
    spec, message = OUT_OF_BOUNDS[case]
    with pytest.raises(AssertionError, match=message):
        check_algorithm(spec, torch_backend, BOX, steps=1024)


def test_check_algorithm_allows_float32_rounding_of_the_bounds(torch_backend: Any) -> None:
    """float32(1.1) is 1.10000002384: an agent that clips to the float32 bounds it was given
    is inside the box."""
    high = np.float32(1.1)
    assert float(high) > 1.1
    info = BOX.__class__(
        "box-test-rounding",
        BOX.observation,
        BOX.action.__class__("box", (2,), "float32", low=(-1.1, -1.1), high=(1.1, 1.1)),
        num_envs=2,
    )
    spec = mutant("td3", predict=shifted("predict", 0, float(high)))
    check_algorithm(spec, torch_backend, info, steps=1024)


# ------------------------------------------------------------------------------------------
# 4. float64 observations from an env whose observation space says float32


def as_float64(env: Any) -> Any:
    import gymnasium as gym

    return gym.wrappers.TransformObservation(
        env, lambda obs: obs.astype(np.float64), env.observation_space
    )


def test_check_env_names_a_float64_observation_of_a_float32_space() -> None:
    """The sync vector env casts the observation batch to the space's dtype, so the float64
    arrays show only as the true final observations (infos["final_obs"])."""
    with pytest.raises(AssertionError, match=r"final_obs\[\d\] has dtype float64") as excinfo:
        check_env(gym_family(as_float64), "CartPole-v1")
    message = str(excinfo.value)
    assert "the observation space says float32" in message
    assert "obs.astype(np.float32)" in message
    assert "outside the observation space" not in message


@pytest.mark.parametrize("wrappers", [(), (reporting({"score": 1.0}),)])
def test_wrapped_family_without_mistakes_passes(wrappers: Sequence[Callable[..., Any]]) -> None:
    """The family the env mutants are built from passes as it is."""
    check_env(gym_family(*wrappers), "Pendulum-v1")


# ------------------------------------------------------------------------------------------
# 5. A recurrent sequence op that is wrong where a quick test would not look


def recurrent_with(change: Callable[..., Any]) -> Callable[..., Any]:
    """Backend.recurrent whose layers call ``change(forward, x, state, starts)`` instead of
    their own forward (``forward`` is the real one, given the call's other keywords)."""

    def make(bk: Any, kind: str, in_dim: int, hidden_dim: int) -> Any:
        layer = bk.recurrent(kind, in_dim, hidden_dim)
        real = layer.forward

        def forward(x: Any, state: Any, starts: Any = None, **kw: Any) -> Any:
            return change(functools.partial(real, **kw), x, state, starts)

        layer.forward = forward
        return layer

    return make


def first_step_starts_only(starts: Any) -> Any:
    flags = np.asarray(starts.detach().cpu().numpy() if hasattr(starts, "detach") else starts)
    flags = flags.copy()
    flags[1:] = False
    return flags


def swapped_gates(bk: Any, model: Any) -> Any:
    """inference() whose recurrent copy has its first two gates swapped (an LSTM's input and
    forget, a GRU's reset and update): right shapes, plausible numbers, another network."""
    if getattr(model, "kind", None) not in sequences.RECURRENT_KINDS:
        return bk.inference(model)
    weights, size = bk.get_weights(model), model.hidden_dim

    def swap(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a[size : 2 * size], a[:size], a[2 * size :]])

    w_ih, b_ih, w_hh, b_hh = (
        swap(weights[f"rnn.{name}_l0"]) for name in ("weight_ih", "bias_ih", "weight_hh", "bias_hh")
    )
    return numpy_nets.recurrent_step(model.kind, w_ih.T, b_ih, w_hh.T, b_hh)


def gradient_without_starts(forward: Any, x: Any, state: Any, starts: Any) -> Any:
    """The values of the sequences with their episode starts, the gradient of the same
    sequences run without them (a straight-through mix-up): only a gradient check sees it."""
    right, plain = forward(x, state, starts), forward(x, state)
    return tuple(
        p if p is None else p + (r - p).detach() for r, p in zip(right, plain, strict=True)
    )


BROKEN_RECURRENT: dict[str, tuple[dict[str, Callable[..., Any]], str]] = {
    "episode starts ignored": (
        {"recurrent": recurrent_with(lambda f, x, s, starts: f(x, s))},
        r"outputs vs inference\(\) stepped, episode starts inside the sequences",
    ),
    "starts honoured at the first step only": (
        {
            "recurrent": recurrent_with(
                lambda f, x, s, starts: f(
                    x, s, None if starts is None else first_step_starts_only(starts)
                )
            )
        },
        r"outputs vs inference\(\) stepped, episode starts inside the sequences",
    ),
    "gate order of the numpy copy": (
        {"inference": swapped_gates},
        r"outputs vs inference\(\) stepped, starts=None",
    ),
    "outputs detached from the graph": (
        {
            "recurrent": recurrent_with(
                lambda f, x, s, starts: tuple(
                    t if t is None else t.detach() for t in f(x, s, starts)
                )
            )
        },
        r"backpropagating a loss on its outputs failed",
    ),
    "gradient of the sequences without their starts": (
        {"recurrent": recurrent_with(gradient_without_starts)},
        r"gradient norm of the fused op with episode starts vs a step-by-step unroll",
    ),
}


@pytest.mark.parametrize("case", BROKEN_RECURRENT)
def test_check_backend_fails_on_a_broken_recurrent_op(case: str, torch_backend: Any) -> None:
    overrides, message = BROKEN_RECURRENT[case]
    with pytest.raises(AssertionError, match=message) as excinfo:
        check_backend(BackendProxy(torch_backend, **overrides))
    assert str(excinfo.value).startswith("backend 'torch'")


def test_check_backend_fails_on_a_final_state_taken_past_a_segment_end(
    torch_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments run padded to the longest; a layer that takes each segment's final state at
    the padded end (not at its own last step) has the right outputs and a wrong state."""
    real = sequences.plan_segments

    def padded(starts: Any) -> Any:
        plan = real(starts)
        if plan is None:
            return None
        full = np.full_like(plan.lengths, plan.gather.shape[0])
        return dataclasses.replace(plan, lengths=full)

    monkeypatch.setattr(sequences, "plan_segments", padded)
    with pytest.raises(AssertionError, match="final state vs inference"):
        check_backend(torch_backend)


def test_check_backend_fails_on_a_recurrent_layer_that_cannot_be_frozen() -> None:
    """Paddle's fused kernel needs a gradient for every weight: run as it is with frozen
    weights (an actor's loss through a recurrent critic), its backward stops. The paddle
    layer works around it (harness_paddle.recurrent); without that, check_backend says so."""
    pytest.importorskip("paddle", reason="paddle is not installed (pip install 'harness[paddle]')")
    import harness_paddle.recurrent as paddle_recurrent

    backend = cpu_backend(first_party()[1], "paddle")
    check_backend(backend)  # as it is, it passes
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            paddle_recurrent.Recurrent,
            "_run",
            lambda self, x, initial, lengths=None: self.rnn(x, initial, lengths),
        )
        with pytest.raises(AssertionError, match=r"frozen\(recurrent\('lstm', 3, 5\)\): "):
            check_backend(backend)


# ------------------------------------------------------------------------------------------
# 6. Per-env acting state that an episode end does not reset


class _ResetsNothing(Policy):
    """A real policy whose ``reset`` keeps the ended rows' state."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def initial_state(self, rows: int) -> State:
        return self.policy.initial_state(rows)

    def act(self, obs: Any, state: State, rng: Any = None, *, explore: bool) -> Any:
        return self.policy.act(obs, state, rng, explore=explore)

    def reset(self, state: State, mask: np.ndarray, *, explore: bool) -> State:
        return state


def test_check_algorithm_fails_when_a_policy_reset_resets_nothing(torch_backend: Any) -> None:
    spec = mutant("ppo", policy=lambda agent: _ResetsNothing(agent.policy()))
    config = spec.config_cls(recurrent="lstm", rnn_hidden=16)
    with pytest.raises(AssertionError, match=r"after reset\(\) of every other row"):
        check_algorithm(spec, torch_backend, DISCRETE, config=config, steps=512)


# ------------------------------------------------------------------------------------------
# 7. weights() that alias the parameters, a learner left stale by its own learn(), weights
# that a checkpoint does not bring back, an observation of the wrong shape


def aliasing_weights() -> dict[str, Callable[..., Any]]:
    """weights() that hand out the same arrays every time, refreshed in place by every
    weights() and learn() call: what returning views of the parameters does."""
    held: dict[int, dict[str, np.ndarray]] = {}

    def refresh(agent: Any) -> dict[str, np.ndarray]:
        arrays = held.setdefault(id(agent), {})
        for key, value in agent.weights().items():
            if key in arrays:
                arrays[key][...] = value
            else:
                arrays[key] = np.array(value, copy=True)
        return arrays

    def learn(agent: Any) -> Any:
        metrics = agent.learn()
        refresh(agent)
        return metrics

    return {"weights": refresh, "learn": learn}


def test_check_algorithm_fails_on_weights_that_learn_overwrites(torch_backend: Any) -> None:
    spec = mutant("ppo", **aliasing_weights())
    with pytest.raises(AssertionError) as excinfo:
        check_algorithm(spec, torch_backend, DISCRETE, steps=1024)
    message = str(excinfo.value)
    assert "overwrote arrays that an earlier weights() returned, in place" in message
    assert "must return copies" in message


def test_stale_acting_copy_after_learn_names_learn(torch_backend: Any) -> None:
    spec = mutant("ppo", learn=keeping_acting_copy("learn"))
    with pytest.raises(AssertionError) as excinfo:
        check_algorithm(spec, torch_backend, DISCRETE, steps=1024)
    message = str(excinfo.value)
    assert "after learn(), the learner's own predict()" in message
    assert "left the learner's acting copy stale" in message
    assert "receiv" not in message and "already acted" not in message


def test_restore_that_changes_a_weight_names_the_key(torch_backend: Any) -> None:
    changed: list[str] = []

    def restore(agent: Any, directory: Any) -> None:
        agent.restore(directory)
        weights = agent.weights()
        key = sorted(weights)[-1]
        changed.append(key)
        agent.set_weights({**weights, key: weights[key] + 1.0})

    spec = mutant("ppo", restore=restore)
    with pytest.raises(AssertionError) as excinfo:
        check_algorithm(spec, torch_backend, DISCRETE, steps=1024)
    message = str(excinfo.value)
    assert "restore(save()) gave different weights()" in message
    assert f"{changed[0]!r} differs in" in message, message


def test_check_env_gives_the_shapes_of_a_wrong_shaped_observation() -> None:
    def three_of_four(env: Any) -> Any:
        import gymnasium as gym

        return gym.wrappers.TransformObservation(env, lambda obs: obs[:3], env.observation_space)

    with pytest.raises(AssertionError) as excinfo:
        check_env(gym_family(three_of_four), "CartPole-v1")
    message = str(excinfo.value)
    assert "wrong shape" in message and "(4,)" in message and "(3,)" in message, message


# ------------------------------------------------------------------------------------------
# 8. A policy made without an agent (a farm actor's) that does not read what it is made from


def _made_with(make_policy: Callable[..., Any]) -> AlgorithmSpec:
    real = first_party()[1].algorithms.get("dqn")
    return dataclasses.replace(real, name="broken_dqn", plugin="tests", make_policy=make_policy)


def _generator_of_its_own(parts: Any) -> Any:
    own = Acting(
        parts.algorithm, parts.env_info, parts.config, np.random.default_rng(0), parts.total_steps
    )
    own.env_steps = parts.env_steps
    policy = dqn.make_policy(own)
    return policy


AGENTLESS = {
    "epsilon frozen at 0 steps": (
        lambda parts: dqn.make_policy(
            Acting(parts.algorithm, parts.env_info, parts.config, parts.rng, parts.total_steps, 0)
        ),
        r"exploring from the learner.s generator state at its env-step count",
    ),
    "a generator of its own": (
        _generator_of_its_own,
        r"exploring from the learner.s generator state",
    ),
}


@pytest.mark.parametrize("case", AGENTLESS)
def test_check_algorithm_fails_on_an_agentless_policy_that_ignores_its_parts(
    case: str, torch_backend: Any
) -> None:
    make_policy, message = AGENTLESS[case]
    with pytest.raises(AssertionError, match=message):
        check_algorithm(_made_with(make_policy), torch_backend, DISCRETE)
