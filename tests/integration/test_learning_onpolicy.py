"""Learning checks for the simpler on-policy algorithms on CartPole-v1 within 300k env steps:
A2C reaches a mean greedy return >= 475 over 20 evaluation episodes, also with its envs stepped
by two actor processes (the farm, ZeroMQ on loopback), and PG (REINFORCE with a baseline)
reaches >= 400. Each run stops at the first periodic evaluation above its config's
stop_at_return; the test then re-evaluates the final checkpoint on 20 fresh episodes (other
seeds), as tests/integration/test_learning.py does. The serial checks run on every installed
backend. CI runs seed 1 of each; the other seeds are marked slow."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from harness.checkpoint import latest_checkpoint
from harness.config import find_pack_file, layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import evaluate, load_agent

ROOT = Path(__file__).resolve().parents[2]
PACK = find_pack_file(ROOT / "competitions" / "cartpole")
A2C = ROOT / "competitions" / "cartpole" / "a2c.toml"
PG = ROOT / "competitions" / "cartpole" / "pg.toml"
BUDGET = 300_000
SLOW_SEEDS = [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)]


def train_and_reevaluate(
    user_file: Path, seed: int, out: Path, overrides: tuple[str, ...] = ()
) -> tuple[float, Path]:
    """Train in-process; the fresh 20-episode mean of the final checkpoint and the run dir."""
    from harness.runtime import train

    pm = make_plugin_manager()
    registry = collect_registry(pm)
    settings = [f"seed={seed}", f"total_steps={BUDGET}", f"out='{out}'", "trackers=['csv']"]
    config = resolve(layer(PACK, [user_file], [*settings, *overrides], environ={}), registry)
    result = train(config, registry, pm)
    assert result.steps <= BUDGET + config.run.num_envs * config.algo.n_steps
    agent = load_agent(config, registry, latest_checkpoint(result.run_dir))
    fresh = evaluate(agent, config, registry, 20, seed=777_000 + seed)
    assert len(fresh.returns) == 20
    return fresh.mean, result.run_dir


@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_a2c_solves_cartpole(seed: int, harness_backend_name: str, tmp_path: Path) -> None:
    mean, _ = train_and_reevaluate(A2C, seed, tmp_path, (f"backend='{harness_backend_name}'",))
    assert mean >= 475.0, f"A2C seed {seed}: fresh 20-episode mean {mean:.1f} < 475"


@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_pg_solves_cartpole(seed: int, harness_backend_name: str, tmp_path: Path) -> None:
    mean, _ = train_and_reevaluate(PG, seed, tmp_path, (f"backend='{harness_backend_name}'",))
    assert mean >= 400.0, f"PG seed {seed}: fresh 20-episode mean {mean:.1f} < 400"


@pytest.mark.distributed
def test_a2c_solves_cartpole_over_the_actor_farm(tmp_path: Path) -> None:
    """The same config with its 8 envs split over 2 actor processes: rollouts stay synchronous
    (on-policy), so A2C learns as in a serial run."""
    mean, run_dir = train_and_reevaluate(A2C, 1, tmp_path, ("actors=2",))
    with (run_dir / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    actors = {float(row["farm/actors"]) for row in rows if row.get("farm/actors")}
    assert actors == {2.0}, f"not a 2-actor farm run: farm/actors = {actors}"
    assert mean >= 475.0, f"A2C over the farm: fresh 20-episode mean {mean:.1f} < 475"
