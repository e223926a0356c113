"""The MyoChallenge packs: the official score, the evaluation protocols, the curriculum and the
learning checks (competitions/myochallenge_2022_die, competitions/myochallenge_2023_relocate,
competitions/myochallenge_2024_osl).

* The official score (episode metric ``score``, logged as ``charts/score``) equals MyoSuite's
  own ``get_metrics`` recomputed over all the recorded episodes of a raw env, for two
  success-rate tasks (Die Reorient, Relocate) and a distance task (OslRun).
* ``harness eval RUN --protocol official`` evaluates on the phase-2 env and prints the score;
  a protocol that does not exist, or one for an env without protocols, exits 2 naming the fix.
* A curriculum stage changes the env's constructor kwargs in every env, serially and on a farm.
* Learning checks (CI): a few minutes of each pack's recipe (Die Reorient on a 2-actor farm,
  Relocate and OslRun serially) clearly beat both a random policy and a zero-activation policy
  (every muscle at rest) on the shaped return, measured here. OslRun's needs its recipe's
  20 ms control step and time-correlated exploration noise (``algo.noise_correlation``): with
  white noise at 10 ms the training return crept up ~15% in 400k steps (docs/competitions.md).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DIE = "myoChallengeDieReorientP1-v0"
OSL = "myoChallengeOslRunFixed-v0"
RELOCATE = "myoChallengeRelocateP1-v0"

try:
    import myosuite  # type: ignore[import-untyped, unused-ignore]  # noqa: F401

    HAVE_MYOSUITE = True
except ImportError:
    HAVE_MYOSUITE = False

pytestmark = pytest.mark.skipif(
    not HAVE_MYOSUITE,
    reason="MyoSuite is not installed: pip install 'harness[myo]' and pip install --no-deps "
    "myosuite==3.0.0",
)


def harness_cli(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def train(pack: str, out: Path, settings: list[str], *args: str) -> Path:
    """``harness run PACK --out OUT ARGS --set=S ...``, which must succeed; its run directory
    (the only one in ``out``)."""
    cli = ["run", pack, "--out", str(out), *args, *(f"--set={s}" for s in settings)]
    proc = harness_cli(cli)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = out.iterdir()
    return run_dir


def rows_of(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


# -- the official score ---------------------------------------------------------------------------
class Recorder:
    """Wraps a raw MyoSuite env and keeps every step's whole info, per episode (the paths
    MyoSuite's get_metrics takes)."""

    def __init__(self, env: Any) -> None:
        import gymnasium as gym

        class _Keep(gym.Wrapper):  # type: ignore[type-arg]
            def step(inner, action: Any) -> Any:
                out = inner.env.step(action)
                self.current.append(out[4])
                if out[2] or out[3]:
                    self.episodes.append(self.current)
                    self.current = []
                return out

        self.episodes: list[list[dict[str, Any]]] = []
        self.current: list[dict[str, Any]] = []
        self.env = _Keep(env)

    def paths(self) -> list[dict[str, Any]]:
        return [
            {
                "env_infos": {
                    part: {k: np.asarray([i[part][k] for i in ep]) for k in ep[0][part]}
                    for part in ("rwd_dict", "obs_dict")
                }
            }
            for ep in self.episodes
        ]


@pytest.mark.parametrize(
    ("env_id", "kwargs", "track"),
    [
        # thresholds wide enough that random actions solve it on some steps of some episodes
        (DIE, {"pos_th": 0.1, "rot_th": 1.5}, None),
        (RELOCATE, {"pos_th": 0.3}, None),  # (the goals lie 25-35 cm from the cube)
        # OslRun places the model 1 m behind start_pos at each reset; a start line moved 0.4 m
        # back after the reset makes random stumbles end on both sides of it (negative track
        # fractions, which the official score clips only after the mean)
        (OSL, {}, (14.6, 13.0)),
    ],
)
def test_the_official_score_is_myosuites_get_metrics_over_the_recorded_episodes(
    env_id: str, kwargs: dict[str, Any], track: tuple[float, float] | None
) -> None:
    import gymnasium as gym

    from harness_myo.episode import MyoEpisodeWrapper

    recorder = Recorder(gym.make(env_id, disable_env_checker=True, **kwargs))
    env = MyoEpisodeWrapper(recorder.env)
    base = env.unwrapped
    placed = getattr(base, "start_pos", None)

    def reset(**kwargs: Any) -> None:
        if track is not None:
            base.start_pos = placed  # where the env puts the model: 1 m behind it
        env.reset(**kwargs)
        if track is not None:
            base.start_pos, base.end_pos = track

    rng = np.random.default_rng(3)
    reset(seed=5)
    per_episode: list[dict[str, float]] = []
    while len(per_episode) < 12:
        _, _, term, trunc, info = env.step(rng.uniform(-1, 1, env.action_space.shape))
        if term or trunc:
            per_episode.append(info["episode_metrics"])
            reset()
    from harness_myo.challenges import protocols

    official = env.unwrapped.get_metrics(recorder.paths())
    score_of = protocols(env_id)["official"].score_of
    columns = {k: [m[k] for m in per_episode] for k in per_episode[0]}
    assert score_of(columns) == pytest.approx(official["score"], abs=1e-9)
    assert 0.0 < official["score"] < 1.0, "the check needs episodes of both kinds"
    if track is not None:
        fractions = columns["track_fraction"]
        assert min(fractions) < 0.0 < max(fractions), "episodes on both sides of the line"
    for key, value in official.items():
        if key != "score" and np.ndim(value) == 0:
            assert np.mean([m[key.replace(" ", "_")] for m in per_episode]) == pytest.approx(
                value
            ), key
    env.close()


# -- protocols and curriculum through the CLI ---------------------------------------------------
@pytest.fixture(scope="module")
def die_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short run of the Die pack on a 2-actor farm with a curriculum that advances at once
    (its metric: episode length, threshold 1): the second stage widens the goal rotations."""
    out = tmp_path_factory.mktemp("runs")
    settings = [
        "run.total_steps=4096",
        "run.max_seconds=0",
        "run.actors=2",
        "run.num_envs=4",
        "run.eval_every=4096",
        "run.eval_episodes=2",
        "run.checkpoint_every=4096",
        "run.log_every=1024",
        "run.progress=false",
        "algo.n_steps=256",
        "backend.threads=1",
        "env.curriculum_metric=episodic_length",
        "env.curriculum_thresholds=[1.0]",
        "env.curriculum=[{}, {kwargs = {goal_rot = [-3.14, 3.14]}}]",
    ]
    return train("competitions/myochallenge_2022_die", out, settings)


def test_the_pack_logs_the_official_score_and_its_curriculum_advances(die_run: Path) -> None:
    rows = rows_of(die_run)
    scores = [float(r["charts/score"]) for r in rows if r.get("charts/score")]
    assert scores and all(0.0 <= s <= 1.0 for s in scores)
    assert any(r.get("eval/score") for r in rows)
    stages = [float(r["charts/stage"]) for r in rows if r.get("charts/stage")]
    assert stages[0] == 0.0 and stages[-1] == 1.0, stages  # farm actors' envs were rebuilt
    config = (die_run / "config.toml").read_text()
    assert "weighted_reward_keys" in config  # the pack's reward weights, kept by the stage


def test_eval_protocol_official_runs_phase_2_and_prints_the_score(die_run: Path) -> None:
    proc = harness_cli(["eval", str(die_run), "--protocol", "official", "--episodes", "3"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on myoChallengeDieReorientP2-v0" in proc.stdout
    assert "over 3 episodes" in proc.stdout
    line = [x for x in proc.stdout.splitlines() if "official evaluation" in x]
    assert (line and "score 0." in line[0]) or "score 1." in line[0], proc.stdout


def test_a_protocol_evaluates_the_challenges_task_not_the_runs_last_stage(die_run: Path) -> None:
    """The run's curriculum widened the goals to +-180 degrees at stage 1 and its checkpoint
    saved that stage. A protocol sets the task back: phase 1 evaluates on the phase-1 env's own
    goal ranges (+-90 degrees, MyoSuite's registration), without the curriculum, keeping the
    reward weights (no score reads them). Measured before this was so: a run whose curriculum
    stopped at +-45 degrees scored 0.060 under --protocol phase1, 0.025 on phase 1's goals."""
    from harness.commands import checkpoint_config
    from harness.plugins import collect_registry, make_plugin_manager

    registry = collect_registry(make_plugin_manager())
    trained, _ = checkpoint_config(die_run, [], registry)
    assert trained.env.curriculum_stage == 1 and trained.env.kwargs["goal_rot"] == [-3.14, 3.14]
    layer = registry.protocol(DIE, "phase1").config_layer(trained.env)
    evaluated, _ = checkpoint_config(die_run, [], registry, extra=(layer, "--protocol phase1"))
    assert evaluated.env.curriculum == [] and "goal_rot" not in evaluated.env.kwargs
    assert evaluated.env.kwargs == {
        "weighted_reward_keys": trained.env.kwargs["weighted_reward_keys"]
    }
    proc = harness_cli(["eval", str(die_run), "--protocol", "phase1", "--episodes", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (note,) = [x for x in proc.stdout.splitlines() if "the challenge's own task" in x]
    assert "curriculum" in note and "kwargs" in note, note
    (means,) = [x for x in proc.stdout.splitlines() if "success" in x and "score" in x]
    assert "stage" not in means, means  # the envs ran without a curriculum


@pytest.mark.parametrize(
    ("protocol", "expected"),
    [("offical", ["official", "phase1", "phase2"])],
)
def test_an_unknown_protocol_exits_2_naming_the_ones_there_are(
    die_run: Path, protocol: str, expected: list[str]
) -> None:
    proc = harness_cli(["eval", str(die_run), "--protocol", protocol])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    for word in expected:
        assert word in proc.stderr


def test_a_protocol_for_an_env_without_protocols_exits_2(tmp_path: Path) -> None:
    settings = ["run.total_steps=256", "run.eval_every=0", "run.progress=false", "algo.n_steps=64"]
    run_dir = train("competitions/cartpole", tmp_path / "runs", settings)
    proc = harness_cli(["eval", str(run_dir), "--protocol", "official"])
    assert proc.returncode == 2
    assert "no evaluation protocols" in proc.stderr and "Traceback" not in proc.stderr


PACKS = ROOT / "competitions"


@pytest.mark.parametrize(
    "files",
    [
        ["myochallenge_2022_die/pack.toml"],
        ["myochallenge_2022_die/pack.toml", "myochallenge_2022_die/lstm.toml"],
        ["myochallenge_2022_die/pack.toml", "myochallenge_2022_die/curriculum.toml"],
        ["myochallenge_2022_die/pack.toml", "myochallenge_2022_die/adaptive.toml"],
        ["myochallenge_2022_die/pack.toml", "myochallenge_2022_die/progress.toml"],
        ["myochallenge_2022_die/pack.toml", "myochallenge_2022_die/closeness.toml"],
        ["myochallenge_2023_relocate/pack.toml"],
        ["myochallenge_2023_relocate/pack.toml", "myochallenge_2023_relocate/lattice.toml"],
        ["myochallenge_2024_osl/pack.toml"],
    ],
)
def test_every_recipe_resolves_and_builds_its_env(files: list[str]) -> None:
    """Each pack file with each recipe resolves against the installed plugins (every key
    known, every value valid), and its env takes the recipe's kwargs."""
    from harness.config import layer, resolve
    from harness.curriculum import configure
    from harness.plugins import collect_registry, make_plugin_manager

    registry = collect_registry(make_plugin_manager())
    raw = layer(PACKS / files[0], [PACKS / f for f in files[1:]], [])
    config = resolve(raw, registry)
    configure(config, registry)  # the curriculum's stage 0 goes in here, as in a run
    spec = registry.env_for(config.run.env)
    envs = spec.make_env(config.run.env, num_envs=1, seed=0, options=config.env)
    envs.step(envs.action_space.sample())
    envs.close()
    if "curriculum" in files[-1]:
        assert config.env.kwargs["goal_rot"] == [-0.785, 0.785]
        assert "weighted_reward_keys" in config.env.kwargs  # merged, not replaced


# -- learning checks ------------------------------------------------------------------------------
def policy_returns(env_id: str, options: Any, policy: str, episodes: int = 24) -> float:
    """Mean shaped return of ``policy`` ('random': uniform actions; 'rest': every muscle at
    rest, action -1, i.e. zero activation) over ``episodes`` episodes of the pack's env."""
    from harness_myo.plugin import make_env

    envs = make_env(env_id, num_envs=4, seed=99, options=options)
    rng = np.random.default_rng(0)
    low, high = envs.action_space.low, envs.action_space.high
    totals, running = [], np.zeros(4)
    while len(totals) < episodes:
        actions = rng.uniform(low, high) if policy == "random" else low
        _, rewards, terms, truncs, _ = envs.step(np.asarray(actions, np.float32))
        running += rewards
        for i in np.flatnonzero(terms | truncs):
            totals.append(running[i])
            running[i] = 0.0
    envs.close()
    return float(np.mean(totals))


LEARNING = {
    # Die Reorient, phase 1: random actions drop the die within ~30 steps (return ~25), a hand
    # at rest holds it all 150 steps but away from the goal (~550); the pack's PPO passes 1.2x
    # the rest policy at ~210k steps (baselines/myochallenge_die_p1: 520 at 184k, 1016 at 266k)
    "die": ("competitions/myochallenge_2022_die", ["run.total_steps=250000", "run.actors=2"]),
    # Relocate, phase 1: the arm at rest keeps its palm ~6 cm from the cube (return ~98),
    # random actions 63; the pack's PPO, serially on one core, is at 1.65x and 1.76x the rest
    # policy at 295k and 303k steps (seed 1, 2026-12-05; its windows 1.18-1.6x from 100k to
    # 250k), the object then ~20 cm from the goal on average against ~31 at rest.
    "relocate": (
        "competitions/myochallenge_2023_relocate",
        ["run.total_steps=300000", "run.actors=0", "backend.threads=1"],
    ),
    # OslRun, flat track, 20 ms steps: every policy falls within ~1.6 s of the running start;
    # random 89, rest 116 (24 episodes here); the pack's PPO with correlated noise is at 1.25x,
    # 1.2x and 1.45x the rest policy at 300k steps, ~7 minutes on one core (docs/competitions.md:
    # seeds 1-3), and 1.18x at seed 1 once every seed came from harness.seeds (2026-12-07):
    # its margin is 15% (MARGIN). Serial: one core, so that the other runs other tests (the
    # suite's second worker).
    "osl": (
        "competitions/myochallenge_2024_osl",
        ["run.total_steps=300000", "run.actors=0", "backend.threads=1"],
    ),
}


# each check's minutes in CI (2026-12-05, clean clone, one pinned core): tests/conftest.py
# spreads the heavy tests over the xdist workers
LEARNING_SECONDS = {"die": 251, "osl": 472, "relocate": 317}
SLOWER_MACHINE = 3.0
"""Each check's time limit over its CI seconds: the steps are fixed, so the wall-clock follows
the CPU, and CI's machines differ (2026-12-07, a clean clone on a slower one: Die 612 s,
Relocate 741 s, OslRun past the suite's 900 s; on this VM type OslRun takes ~800 s)."""


MARGIN = {"die": 1.2, "relocate": 1.2, "osl": 1.15}
"""How far the pack's return must beat the better baseline (OslRun's 300k steps reach only
1.18-1.45x of the rest policy over four measured seeds: see LEARNING)."""


def learning_timeout(name: str) -> float:
    return SLOWER_MACHINE * LEARNING_SECONDS[name]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            name,
            marks=[
                pytest.mark.heavy(seconds=LEARNING_SECONDS[name]),
                pytest.mark.timeout(learning_timeout(name)),
            ],
        )
        for name in sorted(LEARNING)
    ],
)
def test_the_pack_clearly_beats_random_and_resting_policies_within_minutes(
    tmp_path: Path, name: str
) -> None:
    """A few minutes of the pack's own recipe (on a 2-actor farm, or serially): the last
    logged training return (a window of dozens of episodes) beats, by 20% (OslRun: 15%,
    MARGIN), the better of a random and a zero-activation policy measured here on the same
    env and shaping."""
    from harness.config import layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager

    pack, settings = LEARNING[name]
    settings = [
        *settings,
        "run.max_seconds=0",
        "run.eval_every=0",
        "run.checkpoint_every=0",
        "run.log_every=8192",
        "run.progress=false",
        "run.trackers=['csv']",
        "run.seed=1",
    ]
    registry = collect_registry(make_plugin_manager())
    config = resolve(layer(ROOT / pack / "pack.toml", [], settings), registry)
    baseline = max(
        policy_returns(config.run.env, config.env, "random"),
        policy_returns(config.run.env, config.env, "rest"),
    )
    out = tmp_path / "runs"
    proc = harness_cli(
        ["run", pack, "--out", str(out), *(f"--set={s}" for s in settings)],
        timeout=learning_timeout(name) - 60,  # (the baselines above took ~10 s)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = out.iterdir()
    returns = [
        float(r["charts/episodic_return"])
        for r in rows_of(run_dir)
        if r.get("charts/episodic_return")
    ]
    assert returns[-1] > MARGIN[name] * baseline, (returns, baseline)
