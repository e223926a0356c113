"""Numerical parity of the two backends: the same algorithm file, the same initial weights and
the same batch give the same update on torch and on paddle (losses and every parameter after
one gradient step within 1e-5).

Only the starting weights are copied across (torch's Linear keeps ``(out, in)``, paddle's
``(in, out)``); SAC's reparameterised noise is the one thing made equal by hand, since the two
frameworks' generators differ: both backends' Gaussian ``sample`` read the same numpy draws.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from harness.api import EnvInfo, SpaceInfo
from harness.data import ReplayBatch
from harness.plugins import collect_registry, make_plugin_manager
from harness.pytest_plugin import cpu_backend

pytest.importorskip("torch", reason="torch is not installed (pip install 'harness[torch]')")
pytest.importorskip("paddle", reason="paddle is not installed (pip install 'harness[paddle]')")

import torch

import harness_paddle.backend as paddle_backend
import harness_torch.backend as torch_backend

ATOL = 1e-5
BATCH = 64
CARTPOLE = EnvInfo(
    "parity-discrete",
    SpaceInfo("box", (4,), "float32", low=(-5.0,) * 4, high=(5.0,) * 4),
    SpaceInfo("discrete", (), "int64", n=2),
    num_envs=1,
)
PENDULUM = EnvInfo(
    "parity-box",
    SpaceInfo("box", (3,), "float32", low=(-1.0, -1.0, -8.0), high=(1.0, 1.0, 8.0)),
    SpaceInfo("box", (1,), "float32", low=(-2.0,), high=(2.0,)),
    num_envs=1,
)


@pytest.fixture(scope="module")
def backends() -> tuple[Any, Any]:
    registry = collect_registry(make_plugin_manager())
    return cpu_backend(registry, "torch"), cpu_backend(registry, "paddle")


def paddle_layout(src: Any, grads: bool = False) -> dict[str, np.ndarray]:
    """A torch module's weights (or their last gradients) as the paddle network built by the
    same algorithm code holds them: same keys, Linear weights transposed."""
    linear = {name for name, m in src.named_modules() if isinstance(m, torch.nn.Linear)}
    values = (
        {k: p.grad for k, p in src.named_parameters()} if grads else dict(src.state_dict().items())
    )
    out = {}
    for key, value in values.items():
        array = value.detach().numpy()
        owner, _, leaf = key.rpartition(".")
        out[key] = array.T.copy() if owner in linear and leaf == "weight" else array
    return out


def assert_same_weights(src: Any, dst: Any, pd: Any, what: str, lr: float) -> None:
    """Every parameter within ATOL after one Adam step. Where a gradient is at the scale of
    Adam's eps (1e-8), its step ``lr * g / (|g| + eps)`` follows the last bits of ``g``, which
    the frameworks' different summation orders set differently: there the two steps can only
    be said to agree within Adam's largest step, ``lr``."""
    ours, theirs = paddle_layout(src), pd.get_weights(dst)
    grads = paddle_layout(src, grads=True)
    assert set(ours) == set(theirs), what
    moved = 0.0
    for key, value in ours.items():
        stable = np.abs(grads[key]) > 1e-6
        np.testing.assert_allclose(
            theirs[key][stable], value[stable], rtol=0, atol=ATOL, err_msg=f"{what}: {key}"
        )
        np.testing.assert_allclose(theirs[key], value, rtol=0, atol=lr, err_msg=f"{what}: {key}")
        moved = max(moved, float(np.abs(grads[key]).max()))
    assert moved > 1e-3, f"{what}: no gradient reached the weights, the comparison is empty"


def replay_batch(rng: np.random.Generator, info: EnvInfo) -> ReplayBatch:
    obs_dim = info.observation.flat_dim
    if info.action.kind == "discrete":
        actions = rng.integers(0, info.action.n, BATCH)
    else:
        actions = rng.uniform(-1.0, 1.0, (BATCH, info.action.flat_dim)).astype(np.float32)
    return ReplayBatch(
        obs=rng.standard_normal((BATCH, obs_dim)).astype(np.float32),
        actions=actions,
        rewards=rng.standard_normal(BATCH).astype(np.float32),
        next_obs=rng.standard_normal((BATCH, obs_dim)).astype(np.float32),
        dones=(rng.random(BATCH) < 0.1).astype(np.float32),
        weights=np.ones(BATCH, np.float32),
        indices=np.arange(BATCH),
    )


def make_pair(backends: tuple[Any, Any], algo: str, info: EnvInfo, **config: Any) -> list[Any]:
    spec = collect_registry(make_plugin_manager()).algorithms.get(algo)
    return [
        spec.make_agent(info, bk, spec.config_cls(**config), seed=0).algorithm for bk in backends
    ]


def test_dqn_update_matches(backends: tuple[Any, Any]) -> None:
    _, pd = backends
    tq, pq = make_pair(backends, "dqn", CARTPOLE, hidden=[64, 64], max_grad_norm=10.0)
    for net in ("q", "target"):
        pd.set_weights(getattr(pq, net), paddle_layout(getattr(tq, net)))
    batch = replay_batch(np.random.default_rng(1), CARTPOLE)
    t_metrics, p_metrics = tq.learn(batch), pq.learn(batch)
    for key in ("losses/td_loss", "losses/q_values", "losses/grad_norm"):
        assert p_metrics[key] == pytest.approx(t_metrics[key], abs=ATOL), key
    assert_same_weights(tq.q, pq.q, pd, "DQN Q network after one step", tq.config.learning_rate)


@pytest.fixture
def shared_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both backends' Gaussian sample() take mean + std * the same k-th numpy draw."""
    import paddle

    rng = np.random.default_rng(7)
    draws = [rng.standard_normal((BATCH, 1)).astype(np.float32) for _ in range(8)]
    for module, to_tensor in ((torch_backend, torch.as_tensor), (paddle_backend, paddle.to_tensor)):
        queue = iter(draws)

        def sample(self: Any, queue: Iterator[np.ndarray] = queue, convert: Any = to_tensor) -> Any:
            return self.mean + self.log_std.exp() * convert(next(queue))

        monkeypatch.setattr(module._Normal, "sample", sample)


def test_sac_update_matches(backends: tuple[Any, Any], shared_noise: None) -> None:
    _, pd = backends
    ts, ps = make_pair(backends, "sac", PENDULUM, hidden=[64, 64], activation="relu")
    for net in ("actor", "critics", "critics_target"):
        pd.set_weights(getattr(ps, net), paddle_layout(getattr(ts, net)))
    batch = replay_batch(np.random.default_rng(2), PENDULUM)
    t_metrics, p_metrics = ts.learn(batch), ps.learn(batch)
    for key in t_metrics:
        assert p_metrics[key] == pytest.approx(t_metrics[key], abs=ATOL), key
    lr = ts.config.learning_rate
    for net in ("actor", "critics"):
        assert_same_weights(getattr(ts, net), getattr(ps, net), pd, f"SAC {net} after a step", lr)
    # the Polyak target moves by tau * (critic - target): same numbers, no gradient of its own
    t_target, p_target = paddle_layout(ts.critics_target), pd.get_weights(ps.critics_target)
    for key, value in t_target.items():
        np.testing.assert_allclose(p_target[key], value, rtol=0, atol=ATOL, err_msg=key)
    np.testing.assert_allclose(
        pd.numpy(ps.log_alpha), ts.log_alpha.detach().numpy(), rtol=0, atol=ATOL
    )


def test_parallel_mlp_member_alone_matches_the_whole(backends: tuple[Any, Any]) -> None:
    """``model(x, member=j)`` is member j of ``model(x)``: same weights slice, same output."""
    x = np.random.default_rng(3).standard_normal((BATCH, 5)).astype(np.float32)
    for bk in backends:
        net = bk.parallel_mlp(5, [16, 8], [2, 3], activation="relu")
        whole = [bk.numpy(out) for out in net(bk.tensor(x))]
        for j, expected in enumerate(whole):
            (alone,) = net(bk.tensor(x), member=j)
            np.testing.assert_allclose(bk.numpy(alone), expected, rtol=1e-6, atol=1e-6)
        with pytest.raises(TypeError, match="takes one batch"):
            net([bk.tensor(x), bk.tensor(x)], member=0)


def test_td3_update_matches(backends: tuple[Any, Any], shared_noise: None) -> None:
    """Critic and actor step (policy_delay 1): the actor's loss reads the first critic alone."""
    _, pd = backends
    tt, pt = make_pair(backends, "td3", PENDULUM, hidden=[64, 64], policy_delay=1)
    for net in ("actor", "actor_target", "critics", "critics_target"):
        pd.set_weights(getattr(pt, net), paddle_layout(getattr(tt, net)))
    batch = replay_batch(np.random.default_rng(4), PENDULUM)
    t_metrics, p_metrics = tt.learn(batch), pt.learn(batch)
    assert set(t_metrics) == {"losses/actor_loss", "losses/critic_loss", "losses/q_values"}
    for key in t_metrics:
        assert p_metrics[key] == pytest.approx(t_metrics[key], abs=ATOL), key
    lr = tt.config.learning_rate
    for net in ("actor", "critics"):
        assert_same_weights(getattr(tt, net), getattr(pt, net), pd, f"TD3 {net} after a step", lr)
