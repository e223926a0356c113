"""Checkpoints cannot carry code: ``agent.<backend>`` is arrays + JSON (harness.safestate), a
pickle of an earlier version is refused by every command that reads a run directory (the proof:
a doctored file whose ``__reduce__`` would create a marker file, which is never created), and
``harness checkpoint convert RUN --trust`` is the one explicit, documented way to convert one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.api import EnvInfo, SpaceInfo, Transition
from harness.checkpoint import latest_checkpoint
from harness.plugins import collect_registry, make_plugin_manager

torch = pytest.importorskip("torch")

PACK = Path(__file__).resolve().parents[2] / "competitions" / "cartpole"
INFO = EnvInfo(
    "test", SpaceInfo("box", (4,), "float32"), SpaceInfo("discrete", (), "int64", n=2), 4
)


def harness(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "harness.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1024-step CartPole PPO run with two checkpoints and a best/ one."""
    out = tmp_path_factory.mktemp("runs")
    sets = ["name=r", "checkpoint_every=512", "eval_every=512", "eval_episodes=1"]
    sets += ["keep_best=true", "trackers=['csv']"]
    proc = harness(
        "run", str(PACK), "--steps", "1024", "--out", str(out), "--no-progress",
        *(x for s in sets for x in ("--set", s)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / "r"


def copy_run(trained: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "r"
    shutil.copytree(trained, run_dir, ignore=shutil.ignore_patterns(".lock"))
    return run_dir


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of the run directory and its bytes (the lock file aside)."""
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


class Marker:
    """Unpickling this creates ``path``: what a doctored checkpoint would do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (str(self.path), "w"))


def assert_refused(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    err = proc.stderr.strip()
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err, err
    assert err.startswith("harness: error:") and "\n\n" not in err, err
    for needle in needles:
        assert needle in err, err


LOADERS = {
    "eval": lambda run, tmp: ["eval", str(run), "--episodes", "1"],
    "resume": lambda run, tmp: ["run", "--resume", str(run), "--steps", "2048", "--no-progress"],
    "export": lambda run, tmp: ["export", str(run), "--out", str(tmp / "policy.onnx")],
    "collect": lambda run, tmp: [
        "collect",
        str(run),
        "--episodes",
        "1",
        "--out",
        str(tmp / "ds-v0"),
    ],
    "init_from": lambda run, tmp: [
        "run",
        str(PACK),
        "--steps",
        "512",
        "--out",
        str(tmp / "new"),
        "--no-progress",
        "--set",
        f"init_from={run}",
    ],
}


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_a_doctored_checkpoint_runs_no_code(loader: str, trained: Path, tmp_path: Path) -> None:
    if loader == "collect":
        pytest.importorskip("minari")
    run_dir = copy_run(trained, tmp_path)
    marker = tmp_path / "MARKER"
    agent_file = latest_checkpoint(run_dir) / "agent.torch"
    torch.save({"algorithm": Marker(marker), "extra": {}, "rng": {}}, agent_file)
    before = snapshot(run_dir)
    proc = harness(*LOADERS[loader](run_dir, tmp_path))
    assert_refused(proc, str(agent_file), f"harness checkpoint convert {run_dir} --trust")
    assert not marker.exists()
    assert snapshot(run_dir) == before  # config.toml, run.json, checkpoints: byte for byte
    assert not list(tmp_path.glob("new/*")) and not (tmp_path / "ds-v0").exists()  # nothing made


def test_report_reads_no_checkpoint(trained: Path, tmp_path: Path) -> None:
    """``harness report`` reads metrics and JSON only: a doctored checkpoint is not touched."""
    run_dir = copy_run(trained, tmp_path)
    marker = tmp_path / "MARKER"
    torch.save(Marker(marker), latest_checkpoint(run_dir) / "agent.torch")
    before = snapshot(run_dir)
    proc = harness("report", str(run_dir), "--out", str(tmp_path / "report.html"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not marker.exists() and snapshot(run_dir) == before


def test_a_truncated_checkpoint_is_one_clear_error(trained: Path, tmp_path: Path) -> None:
    run_dir = copy_run(trained, tmp_path)
    agent_file = latest_checkpoint(run_dir) / "agent.torch"
    agent_file.write_bytes(agent_file.read_bytes()[: agent_file.stat().st_size // 2])
    before = snapshot(run_dir)
    assert_refused(harness("eval", str(run_dir), "--episodes", "1"), str(agent_file))
    assert_refused(harness("run", "--resume", str(run_dir), "--no-progress"), str(agent_file))
    assert snapshot(run_dir) == before


def test_legacy_checkpoints_convert_only_with_trust(trained: Path, tmp_path: Path) -> None:
    """A run of an earlier version (every agent.torch a torch.save pickle, best/ included):
    refused by eval, not converted without --trust, converted in place with it; the converted
    files hold the same tensors and the run evaluates again."""
    from harness.safestate import load_state

    run_dir = copy_run(trained, tmp_path)
    files = sorted(run_dir.rglob("agent.torch"))
    assert len(files) == 3  # two checkpoints and best/
    originals = {}
    for path in files:
        originals[path] = load_state(path, _TorchNumpy())
        torch.save(load_state(path, _Tensors()), path)  # what torch.save-era harness wrote
    assert_refused(harness("eval", str(run_dir / "best"), "--episodes", "1"), "--trust")
    legacy = snapshot(run_dir)
    refused = harness("checkpoint", "convert", str(run_dir))
    assert_refused(refused, "--trust", "runs any code")
    assert snapshot(run_dir) == legacy
    done = harness("checkpoint", "convert", str(run_dir), "--trust")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3 checkpoint file(s) converted" in done.stdout
    for path, original in originals.items():
        _assert_same(load_state(path, _TorchNumpy()), original, str(path))
    again = harness("eval", str(run_dir), "--episodes", "1")
    assert again.returncode == 0, again.stderr[-2000:]
    noop = harness("checkpoint", "convert", str(run_dir))  # nothing left: no --trust needed
    assert noop.returncode == 0 and "nothing to do" in noop.stdout


class _Tensors:
    """Decode a torch checkpoint's tensors as torch tensors (for writing a legacy copy)."""

    def encode(self, value: Any) -> None:
        return None

    def decode(self, array: np.ndarray, info: Any) -> Any:
        from harness_torch.state import TorchCodec

        return TorchCodec(torch.device("cpu")).decode(array, info)


class _TorchNumpy(_Tensors):
    def decode(self, array: np.ndarray, info: Any) -> Any:
        return super().decode(array, info).float().numpy() if info["dtype"] != "uint8" else array


def _assert_same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray | np.generic):
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b or (a != a and b != b), where


# --- in-process round trips on each installed backend ------------------------------------


def _backend(name: str) -> Any:
    if name == "paddle":
        pytest.importorskip("paddle")
    registry = collect_registry(make_plugin_manager())
    spec: Any = registry.backends.get(name)
    return spec.load(spec.config_cls(threads=1, device="cpu"))


def _agent(backend: Any, seed: int) -> Any:
    registry = collect_registry(make_plugin_manager())
    spec = registry.algorithms.get("ppo")
    backend.seed(seed)
    cfg = spec.config_cls()
    cfg.n_steps, cfg.batch_size, cfg.n_epochs = 8, 8, 2
    return spec.make_agent(INFO, backend, cfg, seed=seed, total_steps=10_000)


def _feed(agent: Any, rng: np.random.Generator, steps: int) -> list[np.ndarray]:
    sampled = []
    for _ in range(steps):
        obs = rng.standard_normal((4, 4)).astype(np.float32)
        actions, extras = agent.sample(obs)
        sampled.append(np.asarray(actions))
        reward = rng.standard_normal(4).astype(np.float32)
        nxt = rng.standard_normal((4, 4)).astype(np.float32)
        done = rng.random(4) < 0.1
        agent.observe(Transition(obs, actions, reward, nxt, done, np.zeros(4, bool), extras))
        agent.learn()
    return sampled


def _as_numpy(tree: Any, backend: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _as_numpy(v, backend) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_as_numpy(v, backend) for v in tree]
    if type(tree).__module__.startswith(("torch", "paddle")) and hasattr(tree, "numpy"):
        return np.asarray(tree.numpy())
    return tree


@pytest.mark.parametrize("name", ["torch", "paddle"])
def test_restore_equals_the_original(name: str, tmp_path: Path) -> None:
    """Weights, optimiser moments and counters come back equal, and the restored agent's
    framework RNG continues where the original's was: it samples the same actions."""
    backend = _backend(name)
    a = _agent(backend, seed=0)
    _feed(a, np.random.default_rng(1), 24)
    a.save(tmp_path / "ck")
    saved = _as_numpy(a.algorithm.state(), backend)
    sampled_a = _feed(a, np.random.default_rng(2), 16)
    b = _agent(backend, seed=99)  # other weights and RNG: all must come from the checkpoint
    b.restore(tmp_path / "ck")
    _assert_same(_as_numpy(b.algorithm.state(), backend), saved, "state")
    sampled_b = _feed(b, np.random.default_rng(2), 16)
    for i, (x, y) in enumerate(zip(sampled_a, sampled_b, strict=True)):
        np.testing.assert_array_equal(x, y, err_msg=f"sample {i}")
    _assert_same(b.weights(), a.weights(), "weights")


def test_paddle_legacy_checkpoint_converts(tmp_path: Path) -> None:
    """A paddle.save checkpoint (GeneratorState RNG, optimiser tensors) converts in place and
    restores equal."""
    import json

    from harness_paddle.framework import paddle

    backend = _backend("paddle")
    a = _agent(backend, seed=0)
    _feed(a, np.random.default_rng(1), 16)  # (a whole rollout: a run checkpoints between them)
    ckpt = tmp_path / "step_0000000001"
    a.save(ckpt)  # data.npz (the rollout so far); agent.paddle is replaced below
    (ckpt / "meta.json").write_text(json.dumps({"backend": "paddle", "step": 1}))
    payload = {
        "algorithm": a.algorithm.state(),
        "extra": a.extra_state(),
        "rng": backend.rng_state(),
    }
    paddle.save(payload, str(ckpt / "agent.paddle"))  # what earlier versions wrote
    saved = _as_numpy(a.algorithm.state(), backend)
    sampled_a = _feed(a, np.random.default_rng(2), 8)
    done = harness("checkpoint", "convert", str(ckpt), "--trust")
    assert done.returncode == 0, done.stderr[-2000:]
    b = _agent(backend, seed=99)
    b.restore(ckpt)
    _assert_same(_as_numpy(b.algorithm.state(), backend), saved, "state")
    sampled_b = _feed(b, np.random.default_rng(2), 8)
    for i, (x, y) in enumerate(zip(sampled_a, sampled_b, strict=True)):
        np.testing.assert_array_equal(x, y, err_msg=f"sample {i}")


def test_a_doctored_offline_dataset_runs_no_code(tmp_path: Path) -> None:
    """Minari rebuilds the env from a dataset's ``env_spec`` (``gym.make`` imports and calls
    the entry point the file names) when its metadata lacks a space: harness refuses first."""
    import json

    pytest.importorskip("minari")
    from harness_offline.testing import random_dataset

    info = EnvInfo(
        "Pendulum-v1",
        SpaceInfo("box", (3,), "float32", low=(-1.0, -1.0, -8.0), high=(1.0, 1.0, 8.0)),
        SpaceInfo("box", (1,), "float32", low=(-2.0,), high=(2.0,)),
        num_envs=1,
    )
    dataset = random_dataset(tmp_path / "data" / "evil-v0", info, episodes=2, length=5)
    marker = tmp_path / "MARKER"
    meta = dataset / "data" / "metadata.json"
    raw = json.loads(meta.read_text())
    del raw["observation_space"]
    spec = {"id": "Evil-v0", "entry_point": "builtins:open", "additional_wrappers": []}
    raw["env_spec"] = json.dumps({**spec, "kwargs": {"file": str(marker), "mode": "w"}})
    meta.write_text(json.dumps(raw))
    pendulum = PACK.parent / "pendulum"
    sets = ["algo=cql", f"algo.dataset={dataset}", "trackers=['csv']"]
    args = ["run", str(pendulum), "--steps", "100", "--out", str(tmp_path / "runs")]
    proc = harness(*args, "--no-progress", *(x for s in sets for x in ("--set", s)))
    assert_refused(proc, str(meta), "observation_space")
    assert not marker.exists() and not list(tmp_path.glob("runs/*"))
