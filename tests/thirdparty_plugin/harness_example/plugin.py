"""The entry point (``[project.entry-points.harness] example = "harness_example.plugin"``).

It registers one of each record a package typically ships: an env family, an algorithm, a
tracker, a competition pack (a data file inside the package) and a CLI subcommand.

Registration hooks return records and instantiate nothing, and this module imports neither
gymnasium nor a NN framework: `harness plugins` stays fast, and the env module is imported only
when a run builds ``ExampleChain-v0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import hookimpl
from harness.errors import ConfigError
from harness.registry import AlgorithmSpec, CommandSpec, CompetitionSpec, EnvSpec, TrackerSpec
from harness_example import reinforce
from harness_example.tracker import JsonlTracker

ENV_IDS = ("ExampleChain-v0",)
PACKS = Path(__file__).resolve().parent / "packs"


@dataclass
class ChainConfig:
    """Options of the example chain env family ([env] section)."""

    length: int = 10
    """Number of states; the reward waits in the last one."""
    max_steps: int = 25
    """Time limit: episodes are truncated after this many steps."""
    slip: float = 0.1
    """Probability that an action moves the other way."""

    def __post_init__(self) -> None:
        if self.length < 2 or self.max_steps < 1 or not 0.0 <= self.slip < 1.0:
            raise ValueError("need length >= 2, max_steps >= 1 and 0 <= slip < 1")


def accepts(env_id: str) -> bool:
    return env_id in ENV_IDS


def known_ids() -> list[str]:
    return list(ENV_IDS)


def make_env(
    env_id: str,
    *,
    num_envs: int = 1,
    seed: int | None = None,
    vector: str = "sync",
    options: ChainConfig | None = None,
) -> Any:
    """A gymnasium vector env of chains with SAME_STEP autoreset."""
    if not accepts(env_id):
        raise ConfigError(f"env family 'example' builds {', '.join(ENV_IDS)}, not {env_id!r}.")
    if vector not in ("sync", "async"):
        raise ConfigError(f"[run] vector = {vector!r} must be 'sync' or 'async'.")
    from harness_example.chain import make_vector_env

    return make_vector_env(options or ChainConfig(), num_envs=num_envs, seed=seed, vector=vector)


@hookimpl
def harness_register_envs() -> list[EnvSpec]:
    return [
        EnvSpec(
            "example",
            make_env=make_env,
            accepts=accepts,
            config_cls=ChainConfig,
            known_ids=known_ids,
            description="ExampleChain-v0: walk right along a slippery chain to the reward",
        )
    ]


@hookimpl
def harness_register_algorithms() -> list[AlgorithmSpec]:
    return [
        AlgorithmSpec(
            "example_reinforce",
            make_agent=reinforce.make_agent,
            make_algorithm=reinforce.Reinforce,  # a farm actor acts without an agent:
            make_policy=reinforce.make_policy,  # the algorithm's networks and the policy
            config_cls=reinforce.ReinforceConfig,
            action_spaces=("discrete",),
            description="REINFORCE with a learned value baseline (example plugin)",
        )
    ]


@hookimpl
def harness_register_trackers() -> list[TrackerSpec]:
    return [TrackerSpec("jsonl", make=JsonlTracker, description="metrics.jsonl, a line per row")]


@hookimpl
def harness_register_competitions() -> list[CompetitionSpec]:
    return [
        CompetitionSpec(
            "example_chain",
            PACKS / "chain" / "pack.toml",
            description="example_reinforce on ExampleChain-v0, logged to metrics.jsonl",
        )
    ]


def _chain_arguments(parser: Any) -> None:
    parser.add_argument("--length", type=int, default=8, help="chain length (default 8)")


def _chain_run(args: Any) -> int:
    if args.length < 2:
        raise ConfigError(f"--length must be >= 2, got {args.length}")
    steps = args.length - 1
    print(f"ExampleChain-v0 of length {args.length}: the best return is 1.0 in {steps} steps")
    return 0


@hookimpl
def harness_register_commands() -> list[CommandSpec]:
    return [
        CommandSpec(
            "example-chain",
            add_arguments=_chain_arguments,
            run=_chain_run,
            help="describe the example chain env",
        )
    ]
