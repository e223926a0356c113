"""A third-party plugin, installed like any other distribution, is found through the
``harness`` entry-point group, listed by `harness plugins`, trained by `harness run`, runs its
own competition pack (package data) by name with its own tracker, and passes the conformance
checks plugin authors get from harness.testing.

The example distribution (tests/thirdparty_plugin) is pip-installed into a temporary
directory once per module; the CLI sees it through PYTHONPATH, in-process tests through
sys.path (importlib.metadata finds its dist-info there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.config import layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import evaluate
from harness.runtime.spaces import env_info
from harness.testing import check_algorithm, check_env

SOURCE = Path(__file__).resolve().parents[1] / "thirdparty_plugin"
PROJECT = tomllib.loads((SOURCE / "pyproject.toml").read_text(encoding="utf-8"))["project"]
ENV_ID = "ExampleChain-v0"
THRESHOLD = 0.9
"""Mean eval return the trained agent must reach; the chain pays 1 at its end, and a uniform
random policy gets there in time in about 12% of episodes."""

PACK = f"""
[run]
algo = "example_reinforce"
env = "{ENV_ID}"
num_envs = 8
eval_every = 5000
eval_episodes = 40
checkpoint_every = 0
log_every = 2000
trackers = ["csv"]

[backend]
threads = 1
"""


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pip install --no-deps --no-build-isolation --target SITE tests/thirdparty_plugin (from a
    copy, so the build leaves no build/ or egg-info in the source tree)."""
    root = tmp_path_factory.mktemp("thirdparty")
    source = root / "source"
    shutil.copytree(
        SOURCE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    site = root / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    cmd += ["--no-index", "--disable-pip-version-check", "--quiet", "--target", str(site)]
    proc = subprocess.run(
        [*cmd, str(source)], capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"pip install of the example plugin failed:\n{proc.stdout}\n{proc.stderr}")
    return site


@pytest.fixture
def installed(site_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The installed example importable in this process (entry points included), undone after."""
    monkeypatch.syspath_prepend(str(site_dir))
    yield site_dir
    for name in [
        m for m in sys.modules if m == "harness_example" or m.startswith("harness_example.")
    ]:
        del sys.modules[name]


def harness_cli(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``harness`` command with the example on PYTHONPATH and autoloading on."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"HARNESS_DISABLE_PLUGIN_AUTOLOAD", "HARNESS_BACKEND", "HARNESS_TRACE"}
    }
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    script = Path(sys.executable).with_name("harness")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "harness.cli"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, timeout=600, check=False
    )


def table_rows(output: str) -> dict[str, list[str]]:
    """`harness plugins` table rows as {plugin: [cells]} (rich draws cells between '│' and
    wraps a long cell onto lines whose first cell is empty: joined here with spaces)."""
    rows: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) != 5 or cells[0] == "plugin":
            current = None
        elif cells[0]:
            current = rows[cells[0]] = cells
        elif current is not None:
            current[:] = [f"{a} {b}".strip() for a, b in zip(current, cells, strict=True)]
    return rows


def test_harness_plugins_lists_the_example(site_dir: Path) -> None:
    proc = harness_cli(site_dir, "plugins")
    assert proc.returncode == 0, proc.stderr
    rows = table_rows(proc.stdout)
    assert "example" in rows, proc.stdout
    _, distribution, version, module, registers = rows["example"]
    assert distribution == PROJECT["name"] == "harness-example-plugin"
    assert version == PROJECT["version"]
    assert module == "harness_example.plugin"
    assert "algorithms: example_reinforce" in registers
    assert "envs: example" in registers
    assert "trackers: jsonl" in registers
    assert "competitions: example_chain" in registers
    assert "broken" not in proc.stdout + proc.stderr


def test_a_plugin_adds_a_cli_command(site_dir: Path) -> None:
    proc = harness_cli(site_dir, "example-chain", "--length", "5")
    assert proc.returncode == 0, proc.stderr
    assert "length 5: the best return is 1.0 in 4 steps" in proc.stdout
    listing = harness_cli(site_dir, "--help")
    assert "example-chain" in listing.stdout and "plugin example" in listing.stdout
    bad = harness_cli(site_dir, "example-chain", "--length", "1")  # its own clear error
    assert bad.returncode != 0 and "--length must be >= 2, got 1" in bad.stderr
    blocked = harness_cli(site_dir, "-p", "no:example", "example-chain")
    assert blocked.returncode != 0 and "invalid choice: 'example-chain'" in blocked.stderr


def test_harness_run_trains_example_reinforce(
    site_dir: Path, installed: Path, tmp_path: Path
) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(PACK, encoding="utf-8")
    out = tmp_path / "runs"
    proc = harness_cli(site_dir, "run", str(pack), "--steps", "10000", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = out.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    plugins = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))["plugins"]
    assert plugins["example"] == {"distribution": PROJECT["name"], "version": PROJECT["version"]}

    random_return = random_policy_return(pack, episodes=200)
    assert random_return < THRESHOLD - 0.5, "the chain is too easy to show learning"
    assert summary["final_eval"] >= THRESHOLD, (
        f"example_reinforce reached {summary['final_eval']:.2f} after {summary['steps']} steps "
        f"(random policy: {random_return:.2f}); see {run_dir}/metrics.csv"
    )


def test_the_packaged_pack_runs_by_name_with_the_example_tracker(
    site_dir: Path, tmp_path: Path
) -> None:
    """`harness run example_chain`: the pack file comes from the installed package's data and
    names the example's ``jsonl`` tracker, which writes a row per logged iteration, the env's
    episode metrics included."""
    out = tmp_path / "runs"
    proc = harness_cli(site_dir, "run", "example_chain", "--steps", "3000", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = out.iterdir()
    config = tomllib.loads((run_dir / "config.toml").read_text(encoding="utf-8"))
    assert config["run"]["trackers"] == ["jsonl", "csv"]
    assert config["env"]["length"] == 10  # the pack's [env] section reached the env family
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) >= 2, lines
    steps = [row["step"] for row in rows]
    assert steps == sorted(steps) and steps[-1] <= 3000 + 8 * 16, steps
    trained = [row for row in rows if "charts/episodic_return" in row]
    assert trained, rows
    for row in trained:
        assert 0.0 <= row["charts/reached_end"] <= 1.0, row
        assert 0.0 <= row["charts/distance"] <= 9.0, row
    assert any(k.startswith("losses/") for row in rows for k in row), rows
    assert "eval/reached_end" in rows[-1], rows[-1]  # the final evaluation's row


def test_the_jsonl_tracker_drops_rows_after_the_resumed_checkpoint(
    installed: Path, tmp_path: Path
) -> None:
    from harness_example.tracker import JsonlTracker

    first = JsonlTracker(tmp_path)
    for step in (100, 200, 300):
        first.record(step, {"charts/episodic_return": step / 100})
    first.close()
    resumed = JsonlTracker(tmp_path, start_step=200)
    resumed.record(300, {"charts/episodic_return": 9.0})
    resumed.close()
    lines = (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    assert [(r["step"], r["charts/episodic_return"]) for r in rows] == [
        (100, 1.0),
        (200, 2.0),
        (300, 9.0),
    ]


class RandomAgent:
    """Uniformly random actions: the baseline a trained agent must beat."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)

    def predict(self, obs: np.ndarray) -> np.ndarray:
        return self.rng.integers(0, self.n, size=len(obs))


def random_policy_return(pack: Path, episodes: int) -> float:
    """The random policy's mean return under the run's own evaluation protocol."""
    pm = make_plugin_manager(autoload=False, load=["example", "torch"])
    registry = collect_registry(pm)
    config = resolve(layer(pack, environ={}), registry)
    agent: Any = RandomAgent(n=2, seed=0)
    return evaluate(agent, config, registry, episodes, seed=12345).mean


def test_installed_example_passes_conformance(installed: Path, torch_backend: Any) -> None:
    pm = make_plugin_manager(autoload=False, load=["gymnasium", "example"])
    assert not pm.broken
    assert pm.infos["example"].distribution == PROJECT["name"]
    registry = collect_registry(pm)
    assert registry.env_for(ENV_ID).plugin == "example"  # gymnasium's family does not claim it
    env_spec = registry.envs.get("example")
    check_env(env_spec, ENV_ID)
    envs = env_spec.make_env(ENV_ID, num_envs=4, seed=0, vector="sync", options=None)
    try:
        info = env_info(ENV_ID, envs)
    finally:
        envs.close()
    spec = registry.algorithms.get("example_reinforce")
    # (farm actors act without an agent: check_algorithm holds that policy to the agent's)
    assert spec.acts_without_agent
    check_algorithm(spec, torch_backend, info)
