"""The CUDA paths: the learner on a GPU (same updates as on CPU, mixed precision, pinned
staging, device metrics), GPU actors of the farm and the monitor's NVML statistics.

Skipped, with the reason, where torch sees no CUDA device (the CI machine and the development
machine have none); run on a GPU machine with ``pytest -m gpu tests/gpu``.
"""

from __future__ import annotations

import csv
import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
]

from harness.api import EnvInfo, SpaceInfo  # noqa: E402
from harness.data import ReplayBatch, RolloutBatch  # noqa: E402
from harness_algos.ddpg import DDPG, DDPGConfig  # noqa: E402
from harness_algos.dqn import DQN, DQNConfig  # noqa: E402
from harness_algos.ppo import PPO, PPOConfig  # noqa: E402
from harness_algos.sac import SAC, SACConfig  # noqa: E402
from harness_algos.td3 import TD3, TD3Config  # noqa: E402
from harness_torch.backend import PIN_MIN_BYTES, TorchBackend  # noqa: E402
from harness_torch.plugin import TorchConfig  # noqa: E402

OBS = 8
ACTIONS = 4
INFO = EnvInfo(
    env_id="synthetic",
    observation=SpaceInfo(kind="box", shape=(OBS,), dtype="float32"),
    action=SpaceInfo(kind="discrete", shape=(), dtype="int64", n=ACTIONS),
    num_envs=1,
)


def _backend(device: str, amp: str = "off", **options: Any) -> TorchBackend:
    return TorchBackend(TorchConfig(device=device, amp=amp, threads=2, **options))


def _replay_batch(rng: np.random.Generator, n: int = 256) -> ReplayBatch:
    return ReplayBatch(
        obs=rng.standard_normal((n, OBS)).astype(np.float32),
        actions=rng.integers(0, ACTIONS, n),
        rewards=rng.standard_normal(n).astype(np.float32),
        next_obs=rng.standard_normal((n, OBS)).astype(np.float32),
        dones=(rng.random(n) < 0.1).astype(np.float32),
        weights=np.ones(n, np.float32),
        indices=np.arange(n),
    )


def _rollout_batch(rng: np.random.Generator, n: int = 256) -> RolloutBatch:
    return RolloutBatch(
        obs=rng.standard_normal((n, OBS)).astype(np.float32),
        actions=rng.integers(0, ACTIONS, n),
        log_probs=np.full(n, -np.log(ACTIONS), np.float32),
        advantages=rng.standard_normal(n).astype(np.float32),
        returns=rng.standard_normal(n).astype(np.float32),
        values=np.zeros(n, np.float32),
    )


def _weights(algo: Any) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, np.float64) for k, v in algo.policy_weights().items()}


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_cuda_learner_steps_match_cpu(algo: str) -> None:
    """The same initial weights and batches give the same weights after 30 updates."""
    results = {}
    for device in ("cpu", "cuda"):
        bk = _backend(device)
        bk.seed(0)  # the networks are initialised on the CPU, then moved
        if algo == "dqn":
            learner: Any = DQN(bk, INFO, DQNConfig(hidden=[64, 64]))
            make = _replay_batch
        else:
            learner = PPO(bk, INFO, PPOConfig(hidden=[64, 64]))
            make = _rollout_batch
        rng = np.random.default_rng(1)
        losses = []
        for step in range(30):
            metrics = learner.learn(make(rng))
            losses.append(next(v for k, v in metrics.items() if k.startswith("losses/")))
            if algo == "dqn" and step % 10 == 9:
                learner.sync_target()
        results[device] = (_weights(learner), losses)
    (cpu_w, cpu_l), (gpu_w, gpu_l) = results["cpu"], results["cuda"]
    assert cpu_w.keys() == gpu_w.keys()
    for key in cpu_w:
        np.testing.assert_allclose(gpu_w[key], cpu_w[key], rtol=1e-3, atol=2e-4, err_msg=key)
    np.testing.assert_allclose(gpu_l, cpu_l, rtol=1e-3, atol=1e-4)
    assert any(not np.allclose(a, b) for a, b in itertools.pairwise(cpu_l))


BOX_INFO = EnvInfo(
    env_id="synthetic-box",
    observation=SpaceInfo(kind="box", shape=(OBS,), dtype="float32"),
    action=SpaceInfo(kind="box", shape=(2,), dtype="float32", low=(-1.0, -1.0), high=(1.0, 1.0)),
    num_envs=1,
)


def _box_batch(rng: np.random.Generator, n: int = 256) -> ReplayBatch:
    batch = _replay_batch(rng, n)
    return batch._replace(actions=rng.uniform(-1, 1, (n, 2)).astype(np.float32))


def test_cuda_ddpg_ensemble_steps_match_cpu() -> None:
    """DDPG draws no random numbers while learning: the same initial weights and batches give
    the same weights after 30 updates of a 2-head ensemble (frozen critics, per-head inputs)."""
    results = {}
    for device in ("cpu", "cuda"):
        bk = _backend(device)
        bk.seed(0)
        learner = DDPG(bk, BOX_INFO, DDPGConfig(hidden=[64, 64], ensemble=2))
        rng = np.random.default_rng(1)
        losses = [learner.learn(_box_batch(rng))["losses/critic_loss"] for _ in range(30)]
        results[device] = (_weights(learner), losses)
    (cpu_w, cpu_l), (gpu_w, gpu_l) = results["cpu"], results["cuda"]
    for key in cpu_w:
        np.testing.assert_allclose(gpu_w[key], cpu_w[key], rtol=1e-3, atol=2e-4, err_msg=key)
    np.testing.assert_allclose(gpu_l, cpu_l, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("amp", ["off", "bf16"])
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_cuda_sac_td3_learn_on_the_gpu(algo: str, amp: str) -> None:
    """SAC and TD3 sample their noise from the device's generator (so CPU and CUDA runs
    differ): on CUDA their updates run, stay finite and move the actor towards the critic's
    gradient (a one-step reward equal to the sum of the actions: the greedy actions rise by
    more than 0.2 on average over 200 updates; checked on CPU)."""
    bk = _backend("cuda", amp=amp)
    bk.seed(0)
    if algo == "sac":
        learner: Any = SAC(bk, BOX_INFO, SACConfig(hidden=[64, 64]))
    else:
        learner = TD3(bk, BOX_INFO, TD3Config(hidden=[64, 64], policy_delay=1))
    rng = np.random.default_rng(1)
    obs = rng.standard_normal((64, OBS)).astype(np.float32)
    first = learner.act(obs).mean()
    for _ in range(200):
        batch = _box_batch(rng)
        batch = batch._replace(
            rewards=batch.actions.sum(-1).astype(np.float32), dones=np.ones(256, np.float32)
        )
        metrics = learner.learn(batch)
        assert all(np.isfinite(v) for v in metrics.values()), metrics
    assert learner.act(obs).mean() > first + 0.2


@pytest.mark.parametrize("amp", ["off", "bf16", "fp16"])
def test_mixed_precision_fits_a_fixed_batch(amp: str) -> None:
    """With the target network frozen, DQN's update is a regression on a fixed batch: every
    precision must cut the TD loss; weights and optimiser state stay float32."""
    bk = _backend("cuda", amp)
    bk.seed(0)
    learner = DQN(bk, INFO, DQNConfig(hidden=[128, 128], learning_rate=1e-3, loss="mse"))
    batch = _replay_batch(np.random.default_rng(2), 512)
    losses = [learner.learn(batch)["losses/td_loss"] for _ in range(300)]
    assert np.isfinite(losses).all(), f"amp={amp}: non-finite losses"
    assert np.mean(losses[-10:]) < 0.3 * np.mean(losses[:10]), (
        f"amp={amp}: TD loss {np.mean(losses[:10]):.4f} -> {np.mean(losses[-10:]):.4f}"
    )
    for p in learner.q.parameters():
        assert p.dtype == torch.float32
    if amp == "fp16":
        assert bk._scaler is not None and bk._scaler.get_scale() > 0
    with bk.autocast():
        out = learner.q_values(learner.q, bk.tensor(batch.obs))
    expected = {"off": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    assert out.dtype == expected
    assert bk.numpy(out).dtype == np.float32


def test_pinned_staging_gives_the_plain_copy() -> None:
    bk = _backend("cuda")
    plain = _backend("cuda", pin_memory=False)
    rng = np.random.default_rng(3)
    frames = [rng.integers(0, 255, (64, 4, 84, 84), dtype=np.uint8) for _ in range(4)]
    assert frames[0].nbytes >= PIN_MIN_BYTES
    staged = [bk.tensor(f) for f in frames]  # one buffer, refilled: earlier results must hold
    torch.cuda.synchronize()
    assert len(bk._staging) == 1
    for f, t in zip(frames, staged, strict=True):
        assert t.device.type == "cuda" and t.dtype == torch.float32
        assert torch.equal(t, plain.tensor(f))
    ints = rng.integers(0, 10, 200_000)
    assert torch.equal(bk.tensor(ints, "int64"), torch.as_tensor(ints, device="cuda"))
    view = frames[0][:, ::2]  # not contiguous
    assert torch.equal(bk.tensor(view), plain.tensor(view))


def test_device_stats_report_the_gpu() -> None:
    bk = _backend("cuda")
    held = bk.tensor(np.ones((1024, 1024), np.float32))
    stats = bk.device_stats()
    assert stats["gpu/torch_allocated_mb"] >= 4.0
    assert stats["gpu/torch_reserved_mb"] >= stats["gpu/torch_allocated_mb"]
    try:
        import pynvml  # noqa: F401
    except ImportError:
        pytest.skip("nvidia-ml-py is not installed: only torch's numbers are reported")
    assert 0 <= stats["gpu/util"] <= 100
    assert 0 < stats["gpu/memory_used_mb"] <= stats["gpu/memory_total_mb"]
    del held


def test_monitor_host_stats_list_the_gpus() -> None:
    pytest.importorskip("pynvml")
    pytest.importorskip("zmq")
    from harness_zmq.monitor import host_stats

    gpus = host_stats()["gpu"]
    assert len(gpus) == torch.cuda.device_count() or os.environ.get("CUDA_VISIBLE_DEVICES")
    assert gpus and all(g["memory_total_mb"] > 1000 for g in gpus)


def test_gpu_actors_get_their_device() -> None:
    pytest.importorskip("zmq")
    import harness
    from harness_zmq.client import _local_gpus, connect

    class Probe:
        def device(self) -> dict[str, Any]:
            import torch as t

            seen = os.environ.get("CUDA_VISIBLE_DEVICES")
            if not t.cuda.is_available():
                return {"visible": seen, "cuda": False}
            x = t.arange(1000, device="cuda", dtype=t.float32)
            return {
                "visible": seen,
                "cuda": True,
                "sum": float(x.sum()),
                "count": t.cuda.device_count(),
            }

    gpus = _local_gpus()
    assert gpus, "the local farm finds no GPU on a machine where torch sees one"
    remote_probe = harness.remote(Probe)
    with connect() as client:
        on_gpu = remote_probe.options(gpus=1)(_client=client).device()
        on_cpu = remote_probe(_client=client).device()
    assert on_gpu["cuda"] and on_gpu["count"] == 1 and on_gpu["sum"] == 499500.0
    assert on_gpu["visible"] in {str(g) for g in gpus}
    assert on_cpu == {"visible": "", "cuda": False}


def _learn_cartpole(tmp_path: Path, overrides: list[str]) -> tuple[float, dict[str, str]]:
    """Train the CartPole pack with ``overrides``; the fresh 20-episode mean of the final
    policy and the last row of the run's metrics CSV."""
    from harness.checkpoint import latest_checkpoint
    from harness.config import layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager
    from harness.runtime import evaluate, load_agent, train

    root = Path(__file__).resolve().parents[2]
    pack = root / "competitions" / "cartpole" / "pack.toml"
    pm = make_plugin_manager()
    registry = collect_registry(pm)
    base = [f"out='{tmp_path}'", "trackers=['csv']", "backend.device='cuda'", "progress=false"]
    config = resolve(layer(pack, [], base + overrides, environ={}), registry)
    result = train(config, registry, pm)
    agent = load_agent(config, registry, latest_checkpoint(result.run_dir))
    assert agent.backend.device == "cuda"
    fresh = evaluate(agent, config, registry, 20, seed=4242)
    rows = list(csv.DictReader((result.run_dir / "metrics.csv").open()))
    return fresh.mean, {k: v for row in rows for k, v in row.items() if v not in ("", None)}


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("ppo, serial", ["total_steps=100000"]),
        ("ppo, 4 farm actors, bf16", ["total_steps=150000", "actors=4", "backend.amp='bf16'"]),
    ],
)
def test_cuda_learner_solves_cartpole(name: str, overrides: list[str], tmp_path: Path) -> None:
    mean, last = _learn_cartpole(tmp_path, overrides)
    assert mean >= 475.0, f"{name}: fresh 20-episode mean {mean:.1f} < 475"
    assert float(last["gpu/torch_peak_mb"]) > 0, sorted(last)


def test_central_inference_acts_on_the_learners_gpu(tmp_path: Path) -> None:
    """run.inference = 'central' with a CUDA learner: the policy server's agent is on the GPU
    (run.inference_device = 'learner', the default) and the farm still solves CartPole."""
    mean, last = _learn_cartpole(
        tmp_path, ["total_steps=150000", "actors=2", "inference='central'"]
    )
    assert float(last["farm/inference_on_accelerator"]) == 1.0, sorted(last)
    assert mean >= 475.0, f"central inference on the GPU: fresh 20-episode mean {mean:.1f} < 475"


def test_auto_serves_an_image_policy_from_the_learners_gpu() -> None:
    """run.inference = 'auto' with a CUDA learner and Pong's image observations goes central
    even with 2 actors (on the CPU it stays per actor: tests/distributed)."""
    from harness.config import layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager
    from harness.runtime import env_info, make_agent, make_envs
    from harness.runtime.acting import choose_central

    root = Path(__file__).resolve().parents[2]
    pack = root / "competitions" / "cartpole" / "pack.toml"
    impala = root / "competitions" / "cartpole" / "impala.toml"
    registry = collect_registry(make_plugin_manager())
    overrides = ["env='ALE/Pong-v5'", "actors=2", "inference='auto'", "backend.device='cuda'"]
    config = resolve(layer(pack, [impala], overrides, environ={}), registry)
    envs = make_envs(config, registry, 1, seed=None)
    info = env_info(config.run.env, envs)
    envs.close()
    central, why = choose_central(config, make_agent(config, registry, info))
    assert central and "learner on cuda" in why, why
