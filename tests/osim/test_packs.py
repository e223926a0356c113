"""The competition packs' machinery on the real OpenSim envs: the wrapper (frame skip, shaping,
the official score beside the shaped return), the curriculum advancing on a metric (serial and
over the actor farm, and kept across a resume), simulator failures, the per-step deadline,
the official evaluation protocol and bad pack options.

Runs are tiny (a handful of 0.01 s steps per episode, the random policy): they check the
machinery, not learning."""

from __future__ import annotations

import csv
import json
import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.config import find_pack_file, layer, resolve
from harness.errors import ConfigError
from harness.plugins import collect_registry, make_plugin_manager

pytest.importorskip("opensim")

ROOT = Path(__file__).resolve().parents[2]
PACKS = ["prosthetics", "learn_to_move"]


def _config(overrides: list[str], pack: str = "prosthetics", files: list[Path] = ()) -> Any:  # type: ignore[assignment]
    pm = make_plugin_manager()
    registry = collect_registry(pm)
    raw = layer(find_pack_file(ROOT / "competitions" / pack), list(files), overrides)
    return pm, registry, resolve(raw, registry)


TINY = [
    "algo=random",
    "run.actors=0",
    "run.num_envs=2",
    "run.max_seconds=0",
    "run.eval_every=0",
    "run.eval_episodes=2",
    "run.checkpoint_every=0",
    "run.log_every=8",
    "run.progress=false",
    "env.time_limit=6",
    "env.frame_skip=2",
    "env.step_deadline=0",
]


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("pack", PACKS)
def test_every_pack_file_resolves_and_its_search_space_checks(pack: str) -> None:
    """Each pack file (and user file beside it) resolves, and harness tune accepts its search
    space (every key exists and every bound gives a valid config)."""
    from harness_optuna.space import check_against_config, read_settings

    pack_file = find_pack_file(ROOT / "competitions" / pack)
    for path in sorted(pack_file.parent.glob("*.toml")):
        files = [] if path == pack_file else [path]
        _pm, registry, config = _config([], pack, files)
        assert config.env.curriculum, "the pack's curriculum is part of the recipe"
    raw = layer(pack_file, [], [])
    check_against_config(
        read_settings(raw.raw_sections["tune"], pack_file), raw, registry, pack_file
    )


@pytest.mark.parametrize("env_id", ["Prosthetics-v0", "L2M2019-v0"])
def test_wrapper_reports_the_official_score_beside_the_shaped_return(env_id: str) -> None:
    """Frame skip sums the shaped rewards of the simulator steps; the episode's official score
    is the sum of the env's own rewards, reported as an episode metric when it ends."""
    from harness_osim.plugin import L2MConfig, ProstheticsConfig, make_one

    opts: Any = (
        ProstheticsConfig(round=2, frame_skip=3, shaping="round2", time_limit=7)
        if env_id == "Prosthetics-v0"
        else L2MConfig(difficulty=3, frame_skip=3, shaping="velocity_effort", time_limit=7)
    )
    env = make_one(env_id, opts)
    n_muscles = env.action_space.shape[0]
    base = env.env
    official: list[float] = []
    original = base.step

    def recording_step(action: Any) -> Any:
        out = original(action)
        official.append(float(out[1]))
        return out

    base.step = recording_step
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    agent_steps = 0
    while True:
        obs, shaped, term, trunc, info = env.step(rng.uniform(0, 1, n_muscles))
        agent_steps += 1
        assert np.all(np.isfinite(obs)) and np.isfinite(shaped)
        if term or trunc:
            break
    assert agent_steps == 3  # 3 + 3 + 1 simulator steps: the last agent step is cut short
    metrics = info["episode_metrics"]
    assert metrics["sim_steps"] == 7 == len(official)
    assert metrics["score"] == pytest.approx(sum(official), abs=1e-9)
    assert metrics["fell"] == float(term)
    assert metrics["sim_error"] == 0.0
    env.close()


def test_a_simulator_failure_ends_the_episode_with_its_reason_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from harness_osim.plugin import ProstheticsConfig, make_one
    from harness_osim.sim import SimulationError

    env = make_one("Prosthetics-v0", ProstheticsConfig(time_limit=50))
    env.reset(seed=1)
    sim = env.unwrapped.sim
    env.step(np.zeros(19))

    def broken() -> None:
        raise SimulationError("integrator failed (injected)")

    sim.integrate = broken
    with caplog.at_level(logging.WARNING, logger="harness_osim.plugin"):
        _obs, _r, term, trunc, info = env.step(np.zeros(19))
    assert trunc and not term
    assert info["episode_metrics"]["sim_error"] == 1.0
    assert "integrator failed (injected)" in caplog.text
    del sim.integrate  # the simulator works again: the next episode runs
    env.reset(seed=2)
    assert np.isfinite(env.step(np.zeros(19))[1])
    env.close()


def _train(config: Any, pm: Any, registry: Any, resume: Path | None = None) -> Any:
    from harness.runtime import train

    return train(config, registry, pm, resume=resume)


@pytest.mark.parametrize("actors", [0, 2])
def test_curriculum_advances_on_its_metric_everywhere_and_survives_resume(
    tmp_path: Path, actors: int
) -> None:
    """Stage 0 -> 1 once the logged window mean of sim_steps reaches 1 (at the first log);
    the envs of the run (the farm actors' too) then report stage 1 and train with the stage's
    options; a resumed run goes on at stage 1."""
    overrides = [
        *TINY,
        f"run.actors={actors}",
        f"run.out={tmp_path}",
        f"run.total_steps={128 if actors == 0 else 256}",
        "env.curriculum_metric=sim_steps",
        "env.curriculum_thresholds=[1.0]",
        'env.curriculum=[{shaping = "official"}, {shaping = "round2", frame_skip = 1}]',
        "run.checkpoint_every=64",
    ]
    pm, registry, config = _config(overrides)
    result = _train(config, pm, registry)
    rows = [r for r in _rows(result.run_dir) if r.get("charts/stage")]
    stages = [float(r["charts/stage"]) for r in rows]
    # (episodes under way at the change finish in stage 0: options change at the next reset)
    assert stages[0] == 0.0 and stages[-1] == 1.0, stages
    # stage 1 drops the frame skip: its episodes are 6 agent steps long (stage 0: 3)
    assert float(rows[-1]["charts/episodic_length"]) == 6.0
    runner = json.loads(next(result.checkpoint.glob("runner.json")).read_text())
    assert runner["env_changes"]["curriculum_stage"] == 1
    # resume: the stage (and its options) go on; no step of stage 0 again
    pm, registry, config = _config([*overrides, f"run.total_steps={192 if actors == 0 else 384}"])
    resumed = _train(config, pm, registry, resume=result.run_dir)
    later = [r for r in _rows(resumed.run_dir) if r.get("charts/stage")]
    assert float(later[-1]["charts/stage"]) == 1.0
    assert float(later[-1]["charts/episodic_length"]) == 6.0


@pytest.mark.parametrize(
    ("pack", "files", "actors"),
    [
        ("prosthetics", [], 2),
        ("prosthetics", ["ddpg.toml"], 0),
        ("learn_to_move", [], 0),
    ],
    ids=["prosthetics-sac-farm", "prosthetics-ddpg-ensemble", "learn_to_move-sac"],
)
def test_packs_learn_on_every_backend(
    tmp_path: Path, pack: str, files: list[str], actors: int, harness_backend_name: str
) -> None:
    """Each pack's own algorithm and networks (SAC 256x256; PARL's multi-head DDPG) take
    gradient steps on each backend and checkpoint them; a tiny budget: machinery only."""
    overrides = [
        *[o for o in TINY if not o.startswith(("algo=", "run.actors="))],
        f"run.backend='{harness_backend_name}'",
        f"run.actors={actors}",
        "run.num_envs=2",
        f"run.out={tmp_path}",
        "run.total_steps=96",
        "run.checkpoint_every=96",
        "algo.learning_starts=32",
        "algo.batch_size=32",
    ]
    pack_dir = ROOT / "competitions" / pack
    pm, registry, config = _config(overrides, pack, [pack_dir / f for f in files])
    result = _train(config, pm, registry)
    losses = [r for r in _rows(result.run_dir) if r.get("losses/critic_loss")]
    assert losses and all(np.isfinite(float(r["losses/critic_loss"])) for r in losses)
    assert (result.checkpoint / f"agent.{harness_backend_name}").is_file()


def _eval(run_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "eval", str(run_dir), *flags],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_official_evaluation_protocol_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """harness eval RUN_DIR --round 2, the deprecated spelling of --protocol round2 (a protocol
    the osim plugin registers): one deprecation line naming the replacement, the round's own
    episode length (time_limit unset), the official score, fall rate and episode length printed
    and the protocol recorded. Both spellings resolve to the same config; a round the env has
    not is refused (exit 2, the rounds named, nothing recorded)."""
    from harness.cli import _parser
    from harness.eval_cli import _eval_config

    pm, registry, config = _config([*TINY, f"run.out={tmp_path}", "run.total_steps=16"])
    result = _train(config, pm, registry)
    flags = ("--episodes", "1", "--set", "env.frame_skip=8")
    proc = _eval(result.run_dir, *flags, "--round", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "score" in out and "fell" in out and "sim_steps" in out, out
    assert "round 2 (1000 steps" in out, out  # the protocol's line: it evaluated as round2
    (warning,) = [line for line in proc.stderr.splitlines() if "deprecated" in line]
    assert warning.startswith("harness: warning: --round") and "--protocol round2" in warning
    sim_steps = float(out.split("sim_steps ")[1].split(",")[0].split()[0])
    fell = float(out.split("fell ")[1].split(",")[0].split()[0])
    # round 2 lasts 1000 steps unless the model falls: longer than the training episodes (6)
    assert sim_steps > 6 and (fell == 1.0 or sim_steps == 1000.0), out
    (line,) = (result.run_dir / "evaluations.jsonl").read_text().splitlines()
    assert json.loads(line)["protocol"] == "round2"

    parser = _parser()[0]
    resolved = {}
    for flag in (["--round", "2"], ["--protocol", "round2"]):
        args = parser.parse_args(["eval", str(result.run_dir), *flags, *flag])
        evaluated, _ckpt, protocol = _eval_config(args, registry)
        assert protocol is not None and protocol.name == "round2"
        resolved[flag[0]] = evaluated.to_dict()
    assert resolved["--round"] == resolved["--protocol"]
    assert (
        resolved["--round"]["env"]["round"] == 2
        and resolved["--round"]["env"]["time_limit"] is None
    )
    assert capsys.readouterr().err.count("deprecated") == 1  # (only --round warns)

    unknown = _eval(result.run_dir, *flags, "--round", "3")
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    (error,) = unknown.stderr.splitlines()
    assert error.startswith("harness: error: --round 3:") and "round1, round2" in error, error
    assert (result.run_dir / "evaluations.jsonl").read_text().splitlines() == [line]


def test_a_hung_simulator_step_kills_its_process_at_the_deadline(tmp_path: Path) -> None:
    """The deadline is a C-level watchdog (faulthandler), so it fires even while the simulator
    holds the GIL; the farm replaces such an actor like any other that died."""
    script = tmp_path / "hang.py"
    script.write_text(
        textwrap.dedent(
            """
            import time, numpy as np
            from harness_osim.plugin import ProstheticsConfig, make_one
            env = make_one("Prosthetics-v0", ProstheticsConfig(step_deadline=1.0))
            env.reset(seed=0)
            env.step(np.zeros(19))  # a normal step is well inside the deadline
            print("stepped", flush=True)
            env.unwrapped.sim.integrate = lambda: time.sleep(60)  # a hung simulator
            env.step(np.zeros(19))
            print("not reached", flush=True)
            """
        )
    )
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "stepped" in proc.stdout and "not reached" not in proc.stdout
    assert "Timeout" in proc.stderr  # faulthandler's report names the stuck frame
    assert time.monotonic() - start < 50


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ('env.shaping="fastest"', ["shaping", "curriculum", "stage 0"]),
        ('env.curriculum=[]", "env.shaping="fastest"', ["shaping", "fixed_speed", "round2"]),
        ('env.curriculum=[]", "env.shaping_coef={velocity = 2.0}', ["velocity", "vel_coef"]),
        ("env.curriculum_thresholds=[1.0]", ["curriculum_thresholds", "3 values"]),
        ("env.curriculum=[{speed = 1}, {}, {}, {}]", ["speed", "stage 0"]),
        ("env.round=3", ["round", "1", "2"]),
    ],
)
def test_bad_pack_options_are_named(tmp_path: Path, override: str, names: list[str]) -> None:
    extra = override.split('", "')  # (some cases set two keys)
    pm, registry, config = _config([*TINY, f"run.out={tmp_path}", "run.total_steps=8", *extra])
    with pytest.raises(ConfigError) as err:
        _train(config, pm, registry)
    for name in names:
        assert name in str(err.value), str(err.value)
