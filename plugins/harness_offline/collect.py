"""``harness collect``: roll out a trained agent (or random actions) in its run's env and write
the episodes as a Minari dataset with Minari's own API (``DataCollector``, HDF5 storage).

The env comes from the run's env plugin like every harness env (a vector env of one, seen
through :class:`SingleEnv` as the plain gymnasium Env that Minari wraps). Episode ``i`` is reset
with seed ``seed + i``; Minari stores the seed with the episode, so each one can be replayed.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from harness.checkpoint import latest_checkpoint
from harness.config import Config, layer, resolve
from harness.errors import CheckpointError, ConfigError, IncompatibleError
from harness.policy import State
from harness.registry import Registry
from harness.runtime import load_agent, make_envs, space_info
from harness_offline.datasets import import_minari, minari_root

DATASET_NAME = re.compile(r"^[-_\w]+-v\d+$")
"""A dataset directory's name is its Minari id without namespace: NAME-vVERSION."""


@dataclass
class CollectResult:
    """What ``harness collect`` wrote."""

    path: Path
    dataset_id: str
    returns: list[float]
    lengths: list[int]
    policy: str

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns))

    def summary(self) -> str:
        return (
            f"wrote {len(self.returns)} episodes ({sum(self.lengths)} steps) of {self.policy} to "
            f"{self.path}: mean return {self.mean_return:.2f} +/- {np.std(self.returns):.2f}. "
            f"Minari id {self.dataset_id!r} under {self.path.parent} "
            f"(MINARI_DATASETS_PATH={self.path.parent} minari.load_dataset('{self.dataset_id}'))"
        )


class SingleEnv(gym.Env):
    """One env of a harness env plugin (a vector env of one) as a plain gymnasium Env.

    ``reset(seed=s)`` reseeds it; the step that ends an episode returns the true final
    observation (the vector env has already reset itself; the next ``reset`` replaces that)."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - (gym.Env declares it)

    def __init__(self, envs: Any, spec: Any) -> None:
        self.envs = envs
        self.observation_space = envs.single_observation_space
        self.action_space = envs.single_action_space
        self.spec = spec

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        obs, _ = self.envs.reset(seed=seed)
        return obs[0], {}

    def step(self, action: Any) -> Any:
        obs, rewards, terminated, truncated, infos = self.envs.step(np.asarray([action]))
        ended = infos.get("_final_obs")
        final = infos["final_obs"][0] if ended is not None and ended[0] else obs[0]
        return final, float(rewards[0]), bool(terminated[0]), bool(truncated[0]), {}

    def close(self) -> None:
        self.envs.close()


def env_spec(envs: Any, env_id: str) -> Any:
    """The gymnasium EnvSpec Minari records (with the run's make kwargs), or None where the env
    is not a gymnasium-registered one or its spec does not serialise."""
    spec = getattr(getattr(envs, "envs", [None])[0], "spec", None)
    if spec is None:
        try:
            spec = gym.spec(env_id)
        except gym.error.Error:
            return None
    try:
        spec.to_json()
    except (ValueError, TypeError):
        return None
    return spec


def source_config(
    source: str,
    registry: Registry,
    policy: str,
    overrides: Sequence[str],
    configs: Sequence[str],
) -> tuple[Config, Path | None]:
    """The config of SOURCE and its checkpoint (None for a pack with --policy random)."""
    from harness.commands import checkpoint_config, pack_file

    try:
        ckpt = latest_checkpoint(Path(source))
    except CheckpointError as exc:
        if policy != "random":
            raise CheckpointError(
                f"harness collect {source}: {exc} To record random actions in a pack's env "
                f"instead, add --policy random."
            ) from None
        raw = layer(pack_file(source, registry), [Path(c) for c in configs], overrides)
        return resolve(raw, registry), None
    if configs:
        raise ConfigError(
            f"--config layers a file over a pack, but {source} is a run: override its config "
            f"with --set KEY=VALUE."
        )
    return checkpoint_config(ckpt, overrides, registry)


Act = Callable[[np.ndarray, bool], Any]
"""One env's action for its observation; the flag is True at an episode's first step."""


def random_policy(space: Any, rng: np.random.Generator) -> Act:
    info = space_info(space)
    if info.kind == "discrete":
        return lambda obs, first: int(rng.integers(info.n))
    low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise ConfigError(
            f"--policy random draws uniform box actions, but the action box {space} is unbounded."
        )
    return lambda obs, first: rng.uniform(low, high).astype(space.dtype)


def agent_policy(agent: Any, space: Any, noise: float, rng: np.random.Generator) -> Act:
    """The agent's greedy action (through its :class:`~harness.policy.Policy`, its per-env
    state reset at each episode's first step), with Gaussian noise (box, std as a fraction of
    the half range, clipped to the box) or epsilon-random actions (discrete) when ``noise`` >
    0."""
    info = space_info(space)
    policy = agent.policy()
    state: list[State] = [{}]

    def greedy(obs: np.ndarray, first: bool) -> Any:
        if first:
            state[0] = policy.reset(policy.initial_state(1), np.ones(1, bool), explore=False)
        actions, _, state[0] = policy.act(obs[None], state[0], explore=False)
        return actions[0]

    if info.kind == "discrete":

        def act_discrete(obs: np.ndarray, first: bool) -> Any:
            action = greedy(obs, first)  # (every step: a recurrent state follows the episode)
            if noise > 0 and rng.random() < noise:
                return int(rng.integers(info.n))
            return int(action)

        return act_discrete
    low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
    half = (high - low) / 2

    def act_box(obs: np.ndarray, first: bool) -> Any:
        action = np.asarray(greedy(obs, first), np.float64)
        if noise > 0:
            action = np.clip(action + rng.normal(0.0, noise, action.shape) * half, low, high)
        return action.astype(space.dtype)

    return act_box


def collect(
    source: str,
    registry: Registry,
    *,
    episodes: int,
    out: Path,
    noise: float = 0.0,
    policy: str = "agent",
    seed: int = 0,
    overrides: Sequence[str] = (),
    configs: Sequence[str] = (),
) -> CollectResult:
    """Record ``episodes`` episodes of SOURCE's policy (or random actions) as a Minari dataset
    in the new directory ``out`` (named NAME-vN)."""
    if episodes < 1:
        raise ConfigError(f"--episodes {episodes}: record at least one episode.")
    if noise < 0:
        raise ConfigError(f"--noise {noise} must be >= 0.")
    if not DATASET_NAME.match(out.name):
        raise ConfigError(
            f"--out {out}: a Minari dataset directory is named by its id, NAME-vVERSION; use "
            f"e.g. --out {out.with_name(out.name + '-v0')}."
        )
    if out.exists():
        raise ConfigError(f"--out {out} already exists; choose another name or delete it.")
    if policy not in ("agent", "random"):
        raise ConfigError(f"--policy {policy!r} must be 'agent' or 'random'.")
    config, ckpt = source_config(source, registry, policy, overrides, configs)
    minari = import_minari()
    rng = np.random.default_rng(seed)
    envs = make_envs(config, registry, 1, seed=None)
    if hasattr(envs, "single_observation_spaces"):  # agent-keyed: not a Minari dataset
        envs.close()
        raise IncompatibleError(
            f"{config.run.env!r} is a multi-agent env (agents: {', '.join(envs.agents)}); "
            f"harness collect records single-agent Minari datasets (one observation and action "
            f"space per step). Record a single-agent env."
        )
    env = SingleEnv(envs, env_spec(envs, config.run.env))
    if policy == "random":
        act, algorithm, described = random_policy(env.action_space, rng), "random", "random actions"
    else:
        assert ckpt is not None
        agent = load_agent(config, registry, ckpt)
        act = agent_policy(agent, env.action_space, noise, rng)
        algorithm = f"harness/{config.run.algo}"
        described = f"{config.run.algo} from {ckpt}" + (f" with noise {noise}" if noise else "")
    out.parent.mkdir(parents=True, exist_ok=True)
    returns, lengths = [], []
    with minari_root(out.parent.absolute()), warnings.catch_warnings():
        # (Minari warns about metadata a local dataset does without: author, permalink, ...)
        warnings.simplefilter("ignore", UserWarning)
        collector = minari.DataCollector(env, record_infos=False, data_format="hdf5")
        try:
            for i in range(episodes):
                obs, _ = collector.reset(seed=seed + i)
                total, length, done = 0.0, 0, False
                while not done:
                    action = act(obs, length == 0)
                    obs, reward, terminated, truncated, _ = collector.step(action)
                    total += reward
                    length += 1
                    done = terminated or truncated
                returns.append(total)
                lengths.append(length)
            collector.create_dataset(
                dataset_id=out.name,
                algorithm_name=algorithm,
                description=(
                    f"harness collect: {episodes} episodes of {described} in {config.run.env} "
                    f"(episode i reset with seed {seed} + i); mean return "
                    f"{np.mean(returns):.2f} +/- {np.std(returns):.2f}"
                ),
            )
        finally:
            collector.close()
    return CollectResult(out, out.name, returns, lengths, described)
