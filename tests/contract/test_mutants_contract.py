"""Four plugin-author mistakes the conformance checks of harness.testing catch, each as a
deliberately broken (mutant) component built from a real first-party one: a stale numpy acting
copy after set_weights or restore, non-float episode metrics, box actions outside the bounds,
and float64 observations from a float32 space. The un-mutated first-party components pass the
same checks in test_conformance.py (every algorithm, CartPole and Pendulum)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from test_conformance import (  # same directory: pytest puts it on sys.path
    BOX,
    DISCRETE,
    AgentProxy,
    first_party,
)

from harness.registry import AlgorithmSpec, EnvSpec
from harness.testing import check_algorithm, check_env

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
