"""The paddle backend's CUDA paths, as test_cuda.py checks torch's: a few learner updates on
the GPU give the CPU's weights, mixed precision (bf16, fp16 with loss scaling) trains,
pinned staging gives the plain copy, and the device statistics read paddle's allocator.

Skipped, with the reason, where paddle is missing or is a CPU build, or sees no GPU (the CI
and development machines; a lent GPU machine has torch but no paddle unless
``paddlepaddle-gpu`` is installed there). Run with ``pytest -m gpu tests/gpu``
(tools/gpu_check.sh does).

``paddle.set_device`` is process-wide: each test builds and runs its CPU learner to the end
before it makes a GPU backend, so no CPU learner's tensor lands on the GPU.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip(
    "paddle", reason="paddle is not installed (pip install 'harness[paddle-gpu]')"
)


def _sees_a_gpu() -> bool:
    try:
        return bool(paddle.device.is_compiled_with_cuda()) and paddle.device.cuda.device_count() > 0
    except Exception:
        return False


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _sees_a_gpu(), reason="paddle is a CPU build or sees no CUDA device"),
]

from harness.api import EnvInfo, SpaceInfo  # noqa: E402
from harness.data import ReplayBatch, RolloutBatch  # noqa: E402
from harness_algos.dqn import DQN, DQNConfig  # noqa: E402
from harness_algos.ppo import PPO, PPOConfig  # noqa: E402
from harness_paddle.backend import PIN_MIN_BYTES, PaddleBackend  # noqa: E402
from harness_paddle.config import PaddleConfig  # noqa: E402

OBS = 8
ACTIONS = 4
INFO = EnvInfo(
    env_id="synthetic",
    observation=SpaceInfo(kind="box", shape=(OBS,), dtype="float32"),
    action=SpaceInfo(kind="discrete", shape=(), dtype="int64", n=ACTIONS),
    num_envs=1,
)


def _backend(device: str, amp: str = "off", **options: Any) -> PaddleBackend:
    return PaddleBackend(PaddleConfig(device=device, amp=amp, threads=2, **options))


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


def _layers(learner: Any) -> dict[str, Any]:
    """The learner's networks (DQN: q and target; PPO: net), by attribute name."""
    return {k: v for k, v in vars(learner).items() if isinstance(v, paddle.nn.Layer)}


def _run(
    algo: str, device: str, start: dict[str, dict[str, np.ndarray]] | None
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray], list[float]]:
    """30 updates of ``algo`` on ``device`` from the weights ``start`` (None: its own
    initialisation); its initial weights, final weights and losses."""
    bk = _backend(device)
    bk.seed(0)
    if algo == "dqn":
        learner: Any = DQN(bk, INFO, DQNConfig(hidden=[64, 64]))
        make = _replay_batch
    else:
        learner = PPO(bk, INFO, PPOConfig(hidden=[64, 64]))
        make = _rollout_batch
    layers = _layers(learner)
    assert layers, f"{algo}: no paddle layers found on the learner"
    if start is not None:  # the GPU's generator draws other numbers: start from the CPU's
        for name, layer in layers.items():
            bk.set_weights(layer, start[name])
    initial = {name: bk.get_weights(layer) for name, layer in layers.items()}
    rng = np.random.default_rng(1)
    losses = []
    for step in range(30):
        metrics = learner.learn(make(rng))
        losses.append(next(v for k, v in metrics.items() if k.startswith("losses/")))
        if algo == "dqn" and step % 10 == 9:
            learner.sync_target()
    final = {
        f"{name}.{k}": np.asarray(v, np.float64)
        for name, layer in layers.items()
        for k, v in bk.get_weights(layer).items()
    }
    return initial, final, losses


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_paddle_cuda_learner_steps_match_cpu(algo: str) -> None:
    """The same initial weights and batches give the same weights after 30 updates."""
    initial, cpu_w, cpu_l = _run(algo, "cpu", None)
    _, gpu_w, gpu_l = _run(algo, "gpu", initial)
    assert cpu_w.keys() == gpu_w.keys()
    for key in cpu_w:
        np.testing.assert_allclose(gpu_w[key], cpu_w[key], rtol=1e-3, atol=2e-4, err_msg=key)
    np.testing.assert_allclose(gpu_l, cpu_l, rtol=1e-3, atol=1e-4)
    assert any(not np.allclose(a, b) for a, b in itertools.pairwise(cpu_l))


@pytest.mark.parametrize("amp", ["off", "bf16", "fp16"])
def test_paddle_mixed_precision_fits_a_fixed_batch(amp: str) -> None:
    """With the target network frozen, DQN's update is a regression on a fixed batch: every
    precision must cut the TD loss; weights stay float32, autocast outputs the low precision
    and the backend hands float32 back to numpy."""
    bk = _backend("gpu", amp)
    bk.seed(0)
    learner = DQN(bk, INFO, DQNConfig(hidden=[128, 128], learning_rate=1e-3, loss="mse"))
    batch = _replay_batch(np.random.default_rng(2), 512)
    losses = [learner.learn(batch)["losses/td_loss"] for _ in range(300)]
    assert np.isfinite(losses).all(), f"amp={amp}: non-finite losses"
    assert np.mean(losses[-10:]) < 0.3 * np.mean(losses[:10]), (
        f"amp={amp}: TD loss {np.mean(losses[:10]):.4f} -> {np.mean(losses[-10:]):.4f}"
    )
    for p in learner.q.parameters():
        assert p.dtype == paddle.float32
    assert (bk._scaler is not None) == (amp == "fp16")
    with bk.autocast():
        out = learner.q_values(learner.q, bk.tensor(batch.obs))
    expected = {"off": paddle.float32, "bf16": paddle.bfloat16, "fp16": paddle.float16}[amp]
    assert out.dtype == expected
    assert bk.numpy(out).dtype == np.float32


def test_paddle_pinned_staging_gives_the_plain_copy() -> None:
    bk = _backend("gpu")
    plain = _backend("gpu", pin_memory=False)
    assert bk._pin and not plain._pin
    rng = np.random.default_rng(3)
    frames = [rng.integers(0, 255, (64, 4, 84, 84), dtype=np.uint8) for _ in range(4)]
    assert frames[0].nbytes >= PIN_MIN_BYTES
    staged = [bk.tensor(f) for f in frames]  # asynchronous copies: earlier results must hold
    paddle.device.cuda.synchronize()
    for f, t in zip(frames, staged, strict=True):
        assert t.place.is_gpu_place() and t.dtype == paddle.float32
        np.testing.assert_array_equal(t.numpy(), plain.tensor(f).numpy())
        np.testing.assert_array_equal(t.numpy(), f.astype(np.float32))
    ints = rng.integers(0, 10, 200_000)
    out = bk.tensor(ints, "int64")
    assert out.place.is_gpu_place() and out.dtype == paddle.int64
    np.testing.assert_array_equal(out.numpy(), ints)
    view = frames[0][:, ::2]  # not contiguous
    np.testing.assert_array_equal(bk.tensor(view).numpy(), view.astype(np.float32))


def test_paddle_device_stats_report_the_gpu() -> None:
    bk = _backend("gpu")
    held = bk.tensor(np.ones((1024, 1024), np.float32))
    stats = bk.device_stats()
    assert stats["gpu/paddle_allocated_mb"] >= 4.0
    assert stats["gpu/paddle_reserved_mb"] >= stats["gpu/paddle_allocated_mb"]
    assert stats["gpu/paddle_peak_mb"] >= stats["gpu/paddle_allocated_mb"]
    del held
