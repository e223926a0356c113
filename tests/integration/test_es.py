"""Learning check for evolution strategies over the actor farm: competitions/cartpole/es.toml
(2 real actor processes over ZeroMQ on loopback, 16 envs) reaches a mean greedy return >= 475 on
CartPole-v1 within 1M env steps. The run stops at a perfect 50-episode evaluation; the test
then re-evaluates the final checkpoint on 20 fresh episodes (other seeds) and checks from the
run's metrics.csv that the experience came from the farm and that ES generations happened.
CI runs seed 1; the other seeds are marked slow."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from harness.checkpoint import latest_checkpoint
from harness.config import find_pack_file, layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import evaluate, load_agent, train

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]
PACK = find_pack_file(ROOT / "competitions" / "cartpole")
ES = ROOT / "competitions" / "cartpole" / "es.toml"
THRESHOLD = 475.0
BUDGET = 1_000_000


@pytest.mark.parametrize(
    "seed", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)]
)
def test_es_on_two_actors_solves_cartpole(seed: int, tmp_path: Path) -> None:
    pm = make_plugin_manager()
    registry = collect_registry(pm)
    overrides = [
        f"seed={seed}",
        f"total_steps={BUDGET}",
        f"out='{tmp_path}'",
        "trackers=['csv']",
        "progress=false",
    ]
    config = resolve(layer(PACK, [ES], overrides, environ={}), registry)
    assert config.run.algo == "es" and config.run.actors == 2
    result = train(config, registry, pm)
    assert result.steps <= BUDGET + config.run.num_envs * config.algo.n_steps

    with (result.run_dir / "metrics.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    farm = [float(r["farm/actors"]) for r in rows if r.get("farm/actors")]
    assert farm and set(farm) == {2.0}, "the run's experience did not come from 2 farm actors"
    generations = [float(r["es/generation"]) for r in rows if r.get("es/generation")]
    assert generations and max(generations) >= 1.0, "no ES generation was completed"

    agent = load_agent(config, registry, latest_checkpoint(result.run_dir))
    fresh = evaluate(agent, config, registry, 20, seed=777_000 + seed)
    assert len(fresh.returns) == 20
    assert fresh.mean >= THRESHOLD, (
        f"ES seed {seed}: fresh 20-episode mean {fresh.mean:.1f} < {THRESHOLD} after "
        f"{result.steps} steps ({max(generations):.0f} generations)"
    )
