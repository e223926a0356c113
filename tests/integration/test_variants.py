"""Options that the learning checks do not exercise: DQN's dueling head and prioritized replay,
PPO on a box action space, async vector envs, and the TensorBoard tracker's event files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.config import find_pack_file, layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import train
from harness.testing import check_algorithm
from harness_algos.dqn import DQNConfig

ROOT = Path(__file__).resolve().parents[2]
PACK = find_pack_file(ROOT / "competitions" / "cartpole")


@pytest.mark.parametrize(
    "options",
    [
        {"dueling": True},
        {"prioritized": True},
        {"dueling": True, "prioritized": True, "double": False},
    ],
)
def test_dqn_variants_conform(options: dict[str, Any], torch_backend: Any) -> None:
    from harness.api import EnvInfo, SpaceInfo

    registry = collect_registry(make_plugin_manager())
    info = EnvInfo(
        "t", SpaceInfo("box", (4,), "float32"), SpaceInfo("discrete", (), "int64", n=3), 2
    )
    config = DQNConfig(learning_starts=64, batch_size=16, train_freq=8, gradient_steps=2, **options)
    check_algorithm(registry.algorithms.get("dqn"), torch_backend, info, config=config)


def _short_run(tmp_path: Path, *overrides: str) -> Any:
    pm = make_plugin_manager()
    registry = collect_registry(pm)
    base = [f"out='{tmp_path}'", "name='r'", "eval_episodes=3", "eval_every=0"]
    config = resolve(layer(PACK, [], [*base, *overrides], environ={}), registry)
    return train(config, registry, pm)


def test_async_vector_envs_and_dueling_per_dqn_train(tmp_path: Path) -> None:
    result = _short_run(
        tmp_path,
        "algo='dqn'",
        "vector='async'",
        "num_envs=2",
        "total_steps=3000",
        "algo.learning_starts=500",
        "algo.dueling=true",
        "algo.prioritized=true",
        "algo.gradient_steps=16",
    )
    assert result.steps >= 3000 and result.episodes > 0
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["steps"] == result.steps


def test_ppo_on_a_box_action_space(tmp_path: Path) -> None:
    result = _short_run(
        tmp_path, "env='Pendulum-v1'", "total_steps=4096", "algo.n_steps=64", "algo.batch_size=64"
    )
    assert result.steps >= 4096
    assert -2000.0 < result.final_eval <= 0.0  # Pendulum returns are negative and bounded


def test_tensorboard_events_hold_the_metrics(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = _short_run(
        tmp_path, "total_steps=2048", "log_every=512", "trackers=['csv', 'tensorboard']"
    )
    events = EventAccumulator(str(result.run_dir / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"charts/episodic_return", "perf/SPS", "losses/value_loss", "eval/mean_return"} <= set(
        tags
    )
    steps = [e.step for e in events.Scalars("perf/SPS")]
    assert steps == sorted(steps) and steps[-1] >= 2048
