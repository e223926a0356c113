"""Switching backends through the real CLI: ``--set backend=paddle`` and ``HARNESS_BACKEND``
select paddle for training, the actor farm and resume; checkpoints record their backend and a
cross-backend restore is refused by name; a missing framework names its extra (exit 2); an
algorithm that declares its backends is refused on another with the list."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import hookimpl
from harness.errors import IncompatibleError
from harness.registry import AlgorithmSpec

PACK = Path(__file__).resolve().parents[2] / "competitions" / "cartpole"
TINY = ["--set", "eval_episodes=2", "--set", "progress=false", "--set", "trackers=['csv']"]

needs_paddle = pytest.mark.skipif(
    importlib.util.find_spec("paddle") is None,
    reason="paddle is not installed (pip install 'harness[paddle]')",
)


def harness(
    *args: str, env: dict[str, str] | None = None, prelude: str = ""
) -> subprocess.CompletedProcess[str]:
    """``python -m harness.cli ARGS``; ``prelude`` runs first in the same interpreter."""
    code = f"{prelude}\nimport sys\nfrom harness.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def only_run_dir(out: Path) -> Path:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def checkpoints(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("step_*"))


@needs_paddle
def test_paddle_trains_resumes_and_refuses_torch_restore(tmp_path: Path) -> None:
    """HARNESS_BACKEND=paddle trains; the checkpoint is paddle's; a resume goes on from it;
    the same checkpoint is refused by name under backend=torch (resume and eval)."""
    first = harness(
        "run", str(PACK), "--set", f"out='{tmp_path}'", "--set", "total_steps=4096", *TINY,
        env={"HARNESS_BACKEND": "paddle"},
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    run_dir = only_run_dir(tmp_path)
    (ckpt,) = checkpoints(run_dir)
    assert (ckpt / "agent.paddle").is_file() and not (ckpt / "agent.torch").exists()
    assert json.loads((ckpt / "meta.json").read_text())["backend"] == "paddle"

    resumed = harness(
        "run", str(PACK), "--resume", str(run_dir), "--set", "total_steps=8192", *TINY,
        "--set", "backend=paddle",
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    steps = [int(p.name.split("_")[1]) for p in checkpoints(run_dir)]
    assert max(steps) >= 8192 and min(steps) == int(ckpt.name.split("_")[1]), steps

    for args in (
        ["run", str(PACK), "--resume", str(run_dir), "--set", "backend=torch"],
        ["eval", str(run_dir), "--episodes", "1", "--set", "backend=torch"],
    ):
        proc = harness(*args)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert "written by backend 'paddle'" in proc.stderr, proc.stderr
        assert "--set backend=paddle" in proc.stderr, proc.stderr

    evaluated = harness("eval", str(run_dir), "--episodes", "2", "--set", "backend=paddle")
    assert evaluated.returncode == 0, evaluated.stderr
    assert "mean return" in evaluated.stdout


@needs_paddle
def test_paddle_learner_over_the_actor_farm(tmp_path: Path) -> None:
    """Two actor processes (forked after the fork server imported paddle) feed a paddle PPO
    learner; the farm's counters show both actors delivering."""
    proc = harness(
        "run", str(PACK), "--set", "backend=paddle", "--set", f"out='{tmp_path}'",
        "--set", "total_steps=8192", "--set", "actors=2", *TINY,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path)
    with (run_dir / "metrics.csv").open() as f:
        last = [r for r in csv.DictReader(f) if r.get("farm/actors")][-1]
    assert float(last["farm/actors"]) == 2.0
    assert float(last["farm/received_steps"]) >= 4096
    assert (checkpoints(run_dir)[-1] / "agent.paddle").is_file()


def test_missing_paddle_names_the_extra() -> None:
    """With paddle unimportable (as on a machine without it), selecting it is one clear
    paragraph naming the extra, exit code 2."""
    proc = harness(
        "run", str(PACK), "--set", "backend=paddle", "--set", "total_steps=64",
        prelude="import sys; sys.modules['paddle'] = None  # import paddle raises ImportError",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "pip install 'harness[paddle]'" in proc.stderr, proc.stderr


class TorchOnly:
    """A plugin whose algorithm declares it needs the torch backend."""

    @hookimpl
    def harness_register_algorithms(self) -> list[AlgorithmSpec]:
        from harness_algos import ppo

        return [
            AlgorithmSpec(
                "torch_ppo",
                make_agent=ppo.make_agent,
                config_cls=ppo.PPOConfig,
                backends=("torch",),
            )
        ]


def test_algorithm_refused_on_a_backend_it_does_not_declare(
    harness_registry_factory: Any, tmp_path: Path
) -> None:
    from harness.config import find_pack_file, layer, resolve
    from harness.plugins import make_plugin_manager
    from harness.runtime import build_run

    real = make_plugin_manager()
    _, registry = harness_registry_factory(
        *(real.get_plugin(n) for n in ("torch", "paddle", "gymnasium", "algos")), TorchOnly()
    )
    overrides = ["algo='torch_ppo'", "backend='paddle'", f"out='{tmp_path}'"]
    config = resolve(layer(find_pack_file(PACK), [], overrides, environ={}), registry)
    with pytest.raises(IncompatibleError) as err:
        build_run(config, registry, real)
    assert not list(tmp_path.iterdir()), "a refused run left a run directory behind"
    message = str(err.value)
    assert "'torch_ppo'" in message and "backend 'paddle'" in message
    assert "supports torch" in message and "--set backend=torch" in message
    assert "ppo" in message.split("runs on 'paddle':")[1]  # the algorithms that do fit
