"""A POPGym memory task: recurrent PPO solves RepeatPreviousEasy, feed-forward PPO cannot.

POPGym (Morad et al. 2023, "POPGym: Benchmarking Partially Observable Reinforcement
Learning", ICLR; ``pip install 'harness[popgym]'``) scores episodes as normalized returns in
[-1, 1]. In RepeatPreviousEasy a 52-card deck is dealt one card per step (51 steps) and, from
the fourth step on, the agent must name the suit of the card shown three cards before the one
it sees: +1/48 when right, -1/48 when wrong (that oracle scores exactly 1.0). Guessing scores
-0.5 (one suit in four), and so does every policy without memory, since a card tells next to
nothing of the suit three cards back. (The paper's per-model tables, normalised returns of
PPO with each memory model, were not readable from this machine, so the band below is the
task's own: 1.0 is perfect recall.) The check: the final checkpoint's greedy mean over 20
fresh episodes is >= 0.9 (>= 95% of the recalls right: the task is solved), and the same PPO
without recurrence stays below 0 (-0.49 and -0.48 on 20 fresh episodes here, the guessing
level), so the check proves memory is used.

Budget: 100k env steps, stopping at the first periodic evaluation >= 0.95. With the settings
below (8 envs x 64 steps, one episode and a bit per rollout; batch 256 = 4 whole sequences;
10 epochs; lr 2e-3 constant; gamma 0.9 and GAE 0.9, as the reward of a step depends on that
step's action alone; entropy 0.01; LSTM of 64) recurrent PPO reached a 16-episode evaluation
>= 0.9 after 20k-41k env steps on each of seeds 1-6 (16-25 s per run on a loaded 2-core
machine), and the feed-forward twin stayed at -0.46 after 50k. CI runs the LSTM on seed 1
(10 s) and the feed-forward control (5 s) with torch; the other seeds, the GRU and the paddle
backend are marked slow.

POPGym's envs give ``Discrete`` observations (RepeatPrevious: the suit 0..3); the gymnasium
env plugin imports popgym when a ``popgym-...`` id is asked for and one-hot encodes discrete
observations, so the runs use POPGym's own id, as a user would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.checkpoint import latest_checkpoint
from harness.config import layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import evaluate, load_agent, train

pytest.importorskip("popgym", reason="popgym is not installed: pip install 'harness[popgym]'")

BUDGET = 100_000
SOLVED = 0.9
"""Normalized return: >= 95% of the recalls right."""
SETTINGS = (
    "run.algo='ppo'",
    "run.num_envs=8",
    f"run.total_steps={BUDGET}",
    "run.eval_every=10000",
    "run.eval_episodes=20",
    "run.stop_at_return=0.95",
    "run.checkpoint_every=0",
    "run.trackers=['csv']",
    "run.progress=false",
    "algo.n_steps=64",
    "algo.batch_size=256",
    "algo.n_epochs=10",
    "algo.learning_rate=2e-3",
    "algo.anneal_lr=false",
    "algo.gamma=0.9",
    "algo.gae_lambda=0.9",
    "algo.ent_coef=0.01",
    "algo.rnn_hidden=64",
    "backend.threads=1",
)


def train_and_reevaluate(
    recurrent: str, seed: int, out: Path, backend: str = "torch", budget: int = BUDGET
) -> float:
    """Train PPO on RepeatPreviousEasy in-process; the final checkpoint's greedy mean over 20
    fresh episodes (other seeds)."""
    pm = make_plugin_manager()
    registry = collect_registry(pm)
    settings = [
        *SETTINGS,
        "run.env='popgym-RepeatPreviousEasy-v0'",
        f"run.seed={seed}",
        f"run.out='{out}'",
        f"run.backend='{backend}'",
        f"run.total_steps={budget}",
        f"algo.recurrent='{recurrent}'",
    ]
    config = resolve(layer(None, [], settings, environ={}), registry)
    result = train(config, registry, pm)
    assert result.steps <= budget + config.run.num_envs * config.algo.n_steps
    agent = load_agent(config, registry, latest_checkpoint(result.run_dir))
    fresh = evaluate(agent, config, registry, 20, seed=777_000 + seed)
    assert len(fresh.returns) == 20
    return fresh.mean


def test_lstm_ppo_solves_repeat_previous_easy(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    mean = train_and_reevaluate("lstm", 1, tmp_path)
    assert mean >= SOLVED, f"LSTM PPO seed 1: fresh 20-episode mean {mean:.3f} < {SOLVED}"


@pytest.mark.slow
@pytest.mark.parametrize(("recurrent", "seed"), [("lstm", 2), ("lstm", 3), ("gru", 1)])
def test_recurrent_ppo_solves_repeat_previous_easy(
    recurrent: str, seed: int, harness_backend_name: str, tmp_path: Path
) -> None:
    mean = train_and_reevaluate(recurrent, seed, tmp_path, harness_backend_name)
    assert mean >= SOLVED, (
        f"{recurrent} PPO seed {seed} on {harness_backend_name}: fresh 20-episode mean "
        f"{mean:.3f} < {SOLVED}"
    )


def test_feedforward_ppo_cannot_repeat_previous(tmp_path: Path) -> None:
    """Without memory the task is guessing (-0.5): half the recurrent budget is plenty to show
    that no feed-forward policy gets near the band."""
    pytest.importorskip("torch")
    mean = train_and_reevaluate("none", 1, tmp_path, budget=BUDGET // 2)
    assert mean < 0.0, f"feed-forward PPO: fresh 20-episode mean {mean:.3f} >= 0 (memoryless?)"
