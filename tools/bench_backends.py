"""Learner updates/s of SAC and PPO on the torch and paddle backends against raw loops.

Four implementations of each update, all in this one process, all on one intra-op thread:

* **harness on torch** and **harness on paddle**: the algorithm of ``harness_algos`` (written
  once against ``harness.api.Backend``) on each backend, loaded through the plugin registry as
  a run loads it; one update is ``algorithm.learn(batch, diagnostics=False)``, what a training
  run calls for every update but the last of an update burst.
* **raw torch** and **raw paddle**: the same update hand-written in plain framework code (the
  batch's numpy arrays in, then only framework tensors, autograd and the framework's own
  optimiser; no harness code): the limit the backend is measured against. A raw loop issues the
  same tensor operations as the algorithm (the same networks, distribution formulas, losses and
  Adam), so the ratio harness / raw is the cost of the abstraction: the backend's dispatch and
  whatever extra work it does per update. Framework calls are the plain idioms:
  ``zero_grad`` / ``backward`` / ``step`` and ``clip_grad_norm_`` in torch; ``backward`` /
  ``step`` / ``clear_grad`` and ``ClipGradByGlobalNorm`` in paddle; the Polyak update is a
  per-tensor ``lerp_`` in torch and ``scale_`` + ``add_`` in paddle (paddle's fastest here).
  Each framework's fastest Adam (torch ``fused=True``, paddle ``use_multi_tensor=True``) and,
  in paddle, the batched pair's bias tiled to the batch rather than broadcast (paddle's CPU
  add that broadcasts ``(2, 1, out)`` is ~35x slower than a same-shape one), as the backends
  do: the raw loops stay the fastest plain code, the limit.

The cases (sizes of a MuJoCo task: 17 observation and 6 action dimensions):

* **SAC**: ``SACConfig`` defaults (SB3's but for the learning rate): actor and twin critics
  256x256 ReLU, batch 256, Adam lr 1e-3, automatic entropy tuning, Polyak tau 0.005. One
  update: the soft-Q step of both critics, the actor step through the (frozen) critics, the
  entropy-coefficient step and the Polyak update of the target critics. The twin critics are
  one batched pair (weights ``(2, in, out)``, one batched product per layer) in the raw loops
  as in harness (``Backend.parallel_mlp``); the actor is a plain ``Sequential`` of linears.
* **PPO**: SB3's / CleanRL's MuJoCo defaults: separate 64x64 tanh actor and critic (evaluated
  as one batched pair, as harness does), a state-independent log-std, minibatch 64, Adam lr 3e-4
  eps 1e-5, clipped surrogate (0.2) + 0.5 x value MSE - 0.01 x entropy (a non-zero
  coefficient so that the entropy term is in the graph), global grad-norm clip 0.5. One
  update: one minibatch gradient step, ``PPO.learn`` (the step ``PPOAgent`` takes per
  minibatch).

Every update converts its batch from numpy (a pool of 16 pre-drawn batches taken in turn; the
harness PPO never sees the same batch object twice in a row, so it converts every time too).
Before timing, each raw loop takes harness's initial weights and both take one update from the
same batch with the same framework seed: the largest parameter difference afterwards is
reported (the raw loops compute the same update). Then each implementation warms up, and the
eight take turns in ``--blocks`` blocks, each implementation ``--block-seconds`` per block (a
fixed update count per case, calibrated on the raw loop in the warm-up): in each block, case by
case (their order reversed every other block), harness and raw run in ABBA order, half the
count each time (harness first in even blocks, raw first in odd ones), so that a drift of the
machine's speed within the block cancels to first order. This VM's speed drifts by 20-40%
within minutes, which separate runs would turn into noise in the ratios. Rates are the median
over blocks; ratios are taken block by block (median, min-max spread, and every block's), in
wall time and in this process's CPU time (which does not count the moments other jobs held the
core, but does count the hypervisor's steal time, which the report gives). Target: every
backend >= 0.90x its raw loop.

    .venv/bin/python tools/bench_backends.py                  # ~3 min on 2 cores
    .venv/bin/python tools/bench_backends.py --quick          # ~25 s smoke run
    .venv/bin/python tools/bench_backends.py --json out.json  # also save the results
    .venv/bin/python tools/bench_backends.py --from-json out.json   # re-render a saved run

One process holds both frameworks: with the other framework imported too, each framework's
harness rates stayed within this machine's noise of those of a process holding it alone
(checked for both), and one process lets the implementations interleave without messaging.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import cpus_and_model

from harness.api import EnvInfo, SpaceInfo
from harness.data import ReplayBatch, RolloutBatch

OBS_DIM, ACT_DIM = 17, 6
POOL = 16
"""Distinct pre-drawn batches each implementation cycles through."""
FRAMEWORKS = ("torch", "paddle")
CASES = ("sac", "ppo")
IMPLS = ("harness", "raw")
TARGET = 0.90
PPO_ENT_COEF = 0.01
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # the actor's log-std clip in harness_algos.sac
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
LOG_2 = math.log(2.0)

CASE_TITLES = {
    "sac": "SAC, 256x256 ReLU, batch 256",
    "ppo": "PPO, 64x64 tanh, minibatch 64",
}


@dataclass
class Learner:
    """One implementation of one case, ready to time."""

    update: Callable[[Any], Any]
    """One update from one pool batch."""
    tensors: Callable[[], list[np.ndarray]]
    """Every trained or target tensor as numpy, in one fixed order (the equality check)."""
    load: Callable[[Sequence[np.ndarray]], None] | None = None
    """Raw loops: take the values :attr:`tensors` returns (harness's initial weights)."""


# -- data and configs -------------------------------------------------------------------------
def env_info() -> EnvInfo:
    """A MuJoCo-sized task: 17 observation dimensions, 6 actions in [-1, 1]."""
    return EnvInfo(
        "bench/MuJoCo-sized",
        SpaceInfo("box", (OBS_DIM,), "float32"),
        SpaceInfo("box", (ACT_DIM,), "float32", low=(-1.0,) * ACT_DIM, high=(1.0,) * ACT_DIM),
        num_envs=1,
    )


def configs() -> dict[str, Any]:
    """The algorithms' configs: SAC's defaults; PPO's defaults with an entropy bonus."""
    from harness_algos.ppo import PPOConfig
    from harness_algos.sac import SACConfig

    sac = SACConfig()
    ppo = PPOConfig(ent_coef=PPO_ENT_COEF)
    assert sac.hidden == [256, 256] and sac.activation == "relu" and sac.batch_size == 256
    assert ppo.hidden == [64, 64] and ppo.activation == "tanh" and ppo.batch_size == 64
    return {"sac": sac, "ppo": ppo}


def replay_pool(batch_size: int, rng: np.random.Generator) -> list[ReplayBatch]:
    """Replay batches as ``ReplayMemory.sample`` returns them (float32, 1% terminal)."""
    n = batch_size

    def obs() -> np.ndarray:
        return rng.standard_normal((n, OBS_DIM)).astype(np.float32)

    return [
        ReplayBatch(
            obs=obs(),
            actions=rng.uniform(-1.0, 1.0, (n, ACT_DIM)).astype(np.float32),
            rewards=rng.standard_normal(n).astype(np.float32),
            next_obs=obs(),
            dones=(rng.random(n) < 0.01).astype(np.float32),
            weights=np.ones(n, np.float32),
            indices=np.arange(n, dtype=np.int64),
        )
        for _ in range(POOL)
    ]


def rollout_pool(batch_size: int, rng: np.random.Generator) -> list[RolloutBatch]:
    """PPO minibatches as ``RolloutBuffer.minibatches`` yields them (advantages normalised;
    log-probabilities of the actions under a unit Gaussian, so the ratios start near 1)."""
    n = batch_size
    pool = []
    for _ in range(POOL):
        actions = rng.standard_normal((n, ACT_DIM)).astype(np.float32)
        adv = rng.standard_normal(n)
        pool.append(
            RolloutBatch(
                obs=rng.standard_normal((n, OBS_DIM)).astype(np.float32),
                actions=actions,
                log_probs=(-0.5 * actions**2 - HALF_LOG_2PI).sum(-1).astype(np.float32),
                advantages=((adv - adv.mean()) / (adv.std() + 1e-8)).astype(np.float32),
                returns=rng.standard_normal(n).astype(np.float32),
                values=rng.standard_normal(n).astype(np.float32),
            )
        )
    return pool


# -- harness ----------------------------------------------------------------------------------
def load_backend(framework: str) -> Any:
    """The backend as a run loads it (registry, one thread, CPU)."""
    from harness.plugins import collect_registry, make_plugin_manager

    spec = collect_registry(make_plugin_manager()).backends.get(framework)
    assert spec.config_cls is not None
    return spec.load(spec.config_cls(device="cpu", threads=1))


def harness_learner(case: str, backend: Any, config: Any) -> Learner:
    """``harness_algos``'s algorithm on ``backend``: one update = ``learn(batch,
    diagnostics=False)``."""
    from harness.plugins import collect_registry, make_plugin_manager

    spec = collect_registry(make_plugin_manager()).algorithms.get(case)
    algo = spec.make_agent(env_info(), backend, config, seed=0).algorithm
    if case == "sac":
        models, params = [algo.actor, algo.critics, algo.critics_target], [algo.log_alpha]
    else:
        models, params = [algo.net], [algo.log_std]

    def tensors() -> list[np.ndarray]:
        out = [w for m in models for w in backend.get_weights(m).values()]
        return out + [np.array(backend.numpy(p), copy=True) for p in params]

    return Learner(lambda batch: algo.learn(batch, diagnostics=False), tensors)


# -- raw torch --------------------------------------------------------------------------------
def raw_torch(case: str, config: Any) -> Learner:
    """The update in plain torch (see the module doc)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    def batched_pair(sizes: list[int]) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """Two MLPs' weights ``(2, in, out)`` and biases ``(2, 1, out)``."""
        ws = [nn.Parameter(torch.randn(2, i, o) / math.sqrt(i)) for i, o in pairwise(sizes)]
        bs = [nn.Parameter(torch.zeros(2, 1, o)) for o in sizes[1:]]
        return ws, bs

    def pair_forward(x: Any, ws: Sequence[Any], bs: Sequence[Any], act: Any) -> Any:
        h = x.unsqueeze(0).expand(2, -1, -1)
        for i, (w, b) in enumerate(zip(ws, bs, strict=True)):
            h = torch.baddbmm(b, h, w)
            if i < len(ws) - 1:
                h = act(h)
        return h

    def loader(params: Sequence[Any]) -> Callable[[Sequence[np.ndarray]], None]:
        @torch.no_grad()
        def load(values: Sequence[np.ndarray]) -> None:
            for p, v in zip(params, values, strict=True):
                p.copy_(torch.as_tensor(v))

        return load

    def numpy_of(params: Sequence[Any]) -> Callable[[], list[np.ndarray]]:
        return lambda: [p.detach().numpy().copy() for p in params]

    if case == "ppo":
        c = config
        ws, bs = batched_pair([OBS_DIM, *c.hidden, ACT_DIM])  # member 0: actor, 1: critic
        log_std = nn.Parameter(torch.full((ACT_DIM,), c.log_std_init))
        trained = [*ws, *bs, log_std]
        opt = torch.optim.Adam(trained, lr=c.learning_rate, eps=1e-5, fused=True)
        clip = c.clip_range

        def ppo_update(b: RolloutBatch) -> None:
            obs, actions = torch.as_tensor(b.obs), torch.as_tensor(b.actions)
            old_logp, adv = torch.as_tensor(b.log_probs), torch.as_tensor(b.advantages)
            returns = torch.as_tensor(b.returns)
            h = pair_forward(obs, ws, bs, torch.tanh)
            mean, value = h[0], h[1, :, 0]
            std_log = log_std.expand_as(mean)
            z = (actions - mean) * torch.exp(-std_log)
            logp = (-0.5 * z.pow(2) - std_log - HALF_LOG_2PI).sum(-1)
            ratio = torch.exp(logp - old_logp)
            pg_loss = -torch.minimum(adv * ratio, adv * ratio.clamp(1 - clip, 1 + clip)).mean()
            v_loss = F.mse_loss(value, returns)
            entropy = (std_log + 0.5 + HALF_LOG_2PI).sum(-1).mean()
            loss = pg_loss + c.vf_coef * v_loss - c.ent_coef * entropy
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(trained, c.max_grad_norm)
            opt.step()

        return Learner(ppo_update, numpy_of(trained), loader(trained))

    c = config
    hidden = list(c.hidden)
    layers: list[nn.Module] = []
    for fan_in, fan_out in pairwise([OBS_DIM, *hidden]):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    actor = nn.Sequential(*layers, nn.Linear(hidden[-1], 2 * ACT_DIM))
    ws, bs = batched_pair([OBS_DIM + ACT_DIM, *hidden, 1])
    critic = [*ws, *bs]
    target = [p.detach().clone() for p in critic]
    t_ws, t_bs = target[: len(ws)], target[len(ws) :]
    log_alpha = nn.Parameter(torch.full((1,), math.log(c.ent_coef)))
    actor_opt = torch.optim.Adam(actor.parameters(), lr=c.learning_rate, fused=True)
    critic_opt = torch.optim.Adam(critic, lr=c.learning_rate, fused=True)
    alpha_opt = torch.optim.Adam([log_alpha], lr=c.learning_rate, fused=True)
    target_entropy = -float(ACT_DIM)

    def policy(obs: Any) -> tuple[Any, Any]:
        out = actor(obs)
        mean, log_std = out[:, :ACT_DIM], out[:, ACT_DIM:].clamp(LOG_STD_MIN, LOG_STD_MAX)
        u = mean + log_std.exp() * torch.randn_like(mean)
        z = (u - mean) * torch.exp(-log_std)
        logp = (-0.5 * z.pow(2) - log_std - HALF_LOG_2PI).sum(-1)
        correction = (2.0 * (LOG_2 - u - F.softplus(-2.0 * u))).sum(-1)
        return torch.tanh(u), logp - correction

    def sac_update(b: ReplayBatch) -> None:
        obs, next_obs = torch.as_tensor(b.obs), torch.as_tensor(b.next_obs)
        actions = torch.as_tensor(b.actions)
        rewards, dones = torch.as_tensor(b.rewards), torch.as_tensor(b.dones)
        with torch.no_grad():
            alpha = log_alpha.exp()
        pi, logp = policy(obs)
        with torch.no_grad():
            next_pi, next_logp = policy(next_obs)
            q_next = pair_forward(torch.cat([next_obs, next_pi], -1), t_ws, t_bs, torch.relu)
            soft = torch.minimum(q_next[0], q_next[1])[:, 0] - alpha * next_logp
            q_target = rewards + c.gamma * (1.0 - dones) * soft
            gap = logp.mean() + target_entropy
        q = pair_forward(torch.cat([obs, actions], -1), ws, bs, torch.relu)
        critic_loss = 0.5 * (F.mse_loss(q[0, :, 0], q_target) + F.mse_loss(q[1, :, 0], q_target))
        critic_opt.zero_grad()
        critic_loss.backward()
        critic_opt.step()
        for p in critic:  # no critic weight gradients in the actor's backward pass
            p.requires_grad_(False)
        q_pi = pair_forward(torch.cat([obs, pi], -1), ws, bs, torch.relu)
        actor_loss = (alpha * logp - torch.minimum(q_pi[0], q_pi[1])[:, 0]).mean()
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()
        for p in critic:
            p.requires_grad_(True)
        alpha_loss = -(log_alpha * gap).sum()
        alpha_opt.zero_grad()
        alpha_loss.backward()
        alpha_opt.step()
        with torch.no_grad():
            for t, s in zip(target, critic, strict=True):
                t.lerp_(s, c.tau)

    every = [*actor.parameters(), *critic, *target, log_alpha]
    return Learner(sac_update, numpy_of(every), loader(every))


# -- raw paddle -------------------------------------------------------------------------------
def raw_paddle(case: str, config: Any) -> Learner:
    """The update in plain paddle (see the module doc)."""
    import paddle
    import paddle.nn.functional as F
    from paddle import nn

    def param(value: np.ndarray) -> Any:
        return paddle.create_parameter(
            list(value.shape), "float32", default_initializer=nn.initializer.Assign(value)
        )

    def batched_pair(sizes: list[int]) -> tuple[list[Any], list[Any]]:
        """Two MLPs' weights ``(2, in, out)`` and biases ``(2, 1, out)``."""
        rng = np.random.default_rng(0)
        ws = [
            param((rng.standard_normal((2, i, o)) / math.sqrt(i)).astype(np.float32))
            for i, o in pairwise(sizes)
        ]
        bs = [param(np.zeros((2, 1, o), np.float32)) for o in sizes[1:]]
        return ws, bs

    def pair_forward(x: Any, ws: Sequence[Any], bs: Sequence[Any], act: Any) -> Any:
        h = x  # (B, in) @ (2, in, out) broadcasts to (2, B, out)
        for i, (w, b) in enumerate(zip(ws, bs, strict=True)):
            # the bias tiled: paddle's CPU add broadcasting (2, 1, out) is ~35x slower
            h = paddle.matmul(h, w) + paddle.tile(b, [1, h.shape[-2], 1])
            if i < len(ws) - 1:
                h = act(h)
        return h

    def loader(params: Sequence[Any]) -> Callable[[Sequence[np.ndarray]], None]:
        def load(values: Sequence[np.ndarray]) -> None:
            with paddle.no_grad():
                for p, v in zip(params, values, strict=True):
                    p.set_value(np.asarray(v, np.float32))

        return load

    def numpy_of(params: Sequence[Any]) -> Callable[[], list[np.ndarray]]:
        return lambda: [np.array(p.numpy(), copy=True) for p in params]

    if case == "ppo":
        c = config
        ws, bs = batched_pair([OBS_DIM, *c.hidden, ACT_DIM])  # member 0: actor, 1: critic
        log_std = param(np.full(ACT_DIM, c.log_std_init, np.float32))
        trained = [*ws, *bs, log_std]
        opt = paddle.optimizer.Adam(
            learning_rate=c.learning_rate,
            parameters=trained,
            epsilon=1e-5,
            grad_clip=nn.ClipGradByGlobalNorm(c.max_grad_norm),
            use_multi_tensor=True,
        )
        clip = c.clip_range

        def ppo_update(b: RolloutBatch) -> None:
            obs, actions = paddle.to_tensor(b.obs), paddle.to_tensor(b.actions)
            old_logp, adv = paddle.to_tensor(b.log_probs), paddle.to_tensor(b.advantages)
            returns = paddle.to_tensor(b.returns)
            h = pair_forward(obs, ws, bs, paddle.tanh)
            mean, value = h[0], h[1, :, 0]
            std_log = paddle.broadcast_to(log_std, mean.shape)
            z = (actions - mean) * paddle.exp(-std_log)
            logp = (-0.5 * z * z - std_log - HALF_LOG_2PI).sum(-1)
            ratio = paddle.exp(logp - old_logp)
            pg_loss = -paddle.minimum(adv * ratio, adv * paddle.clip(ratio, 1 - clip, 1 + clip))
            v_err = value - returns
            entropy = (std_log + 0.5 + HALF_LOG_2PI).sum(-1).mean()
            loss = pg_loss.mean() + c.vf_coef * (v_err * v_err).mean() - c.ent_coef * entropy
            loss.backward()
            opt.step()
            opt.clear_grad()

        return Learner(ppo_update, numpy_of(trained), loader(trained))

    c = config
    hidden = list(c.hidden)
    layers: list[nn.Layer] = []
    for fan_in, fan_out in pairwise([OBS_DIM, *hidden]):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    actor = nn.Sequential(*layers, nn.Linear(hidden[-1], 2 * ACT_DIM))
    ws, bs = batched_pair([OBS_DIM + ACT_DIM, *hidden, 1])
    critic = [*ws, *bs]
    target = [paddle.to_tensor(p.numpy()) for p in critic]  # plain tensors, no gradient
    t_ws, t_bs = target[: len(ws)], target[len(ws) :]
    log_alpha = param(np.full(1, math.log(c.ent_coef), np.float32))
    lr = c.learning_rate
    merged = {"learning_rate": lr, "use_multi_tensor": True}
    actor_opt = paddle.optimizer.Adam(parameters=actor.parameters(), **merged)
    critic_opt = paddle.optimizer.Adam(parameters=critic, **merged)
    alpha_opt = paddle.optimizer.Adam(parameters=[log_alpha], **merged)
    target_entropy = -float(ACT_DIM)

    def policy(obs: Any) -> tuple[Any, Any]:
        out = actor(obs)
        mean = out[:, :ACT_DIM]
        log_std = paddle.clip(out[:, ACT_DIM:], LOG_STD_MIN, LOG_STD_MAX)
        u = mean + paddle.exp(log_std) * paddle.standard_normal(mean.shape, dtype=mean.dtype)
        z = (u - mean) * paddle.exp(-log_std)
        logp = (-0.5 * z * z - log_std - HALF_LOG_2PI).sum(-1)
        correction = (2.0 * (LOG_2 - u - F.softplus(-2.0 * u))).sum(-1)
        return paddle.tanh(u), logp - correction

    def sac_update(b: ReplayBatch) -> None:
        obs, next_obs = paddle.to_tensor(b.obs), paddle.to_tensor(b.next_obs)
        actions = paddle.to_tensor(b.actions)
        rewards, dones = paddle.to_tensor(b.rewards), paddle.to_tensor(b.dones)
        with paddle.no_grad():
            alpha = paddle.exp(log_alpha)
        pi, logp = policy(obs)
        with paddle.no_grad():
            next_pi, next_logp = policy(next_obs)
            q_next = pair_forward(paddle.concat([next_obs, next_pi], -1), t_ws, t_bs, F.relu)
            soft = paddle.minimum(q_next[0], q_next[1])[:, 0] - alpha * next_logp
            q_target = rewards + c.gamma * (1.0 - dones) * soft
            gap = logp.mean() + target_entropy
        q = pair_forward(paddle.concat([obs, actions], -1), ws, bs, F.relu)
        e1, e2 = q[0, :, 0] - q_target, q[1, :, 0] - q_target
        critic_loss = 0.5 * ((e1 * e1).mean() + (e2 * e2).mean())
        critic_loss.backward()
        critic_opt.step()
        critic_opt.clear_grad()
        for p in critic:  # no critic weight gradients in the actor's backward pass
            p.stop_gradient = True
        q_pi = pair_forward(paddle.concat([obs, pi], -1), ws, bs, F.relu)
        actor_loss = (alpha * logp - paddle.minimum(q_pi[0], q_pi[1])[:, 0]).mean()
        actor_loss.backward()
        actor_opt.step()
        actor_opt.clear_grad()
        for p in critic:
            p.stop_gradient = False
        alpha_loss = -(log_alpha * gap).sum()
        alpha_loss.backward()
        alpha_opt.step()
        alpha_opt.clear_grad()
        with paddle.no_grad():  # (the fastest of lerp_, assign and set_value here)
            for t, s in zip(target, critic, strict=True):
                t.scale_(1.0 - c.tau).add_(s * c.tau)

    every = [*actor.parameters(), *critic, *target, log_alpha]
    return Learner(sac_update, numpy_of(every), loader(every))


# -- measurement ------------------------------------------------------------------------------
def seed(framework: str, value: int) -> None:
    if framework == "torch":
        import torch

        torch.manual_seed(value)
    else:
        import paddle

        paddle.seed(value)


def check(framework: str, harness: Learner, raw: Learner, batch: Any) -> float:
    """The raw loop takes harness's weights; both take one update from ``batch`` with the same
    framework seed (the same policy noise); the largest parameter difference afterwards."""
    assert raw.load is not None
    before = harness.tensors()
    raw.load(before)
    seed(framework, 12345)
    harness.update(batch)
    seed(framework, 12345)
    raw.update(batch)
    after_h, after_r = harness.tensors(), raw.tensors()
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(after_h, before, strict=True))
    if moved == 0.0:
        raise RuntimeError(f"{framework}: an update changed no parameter")
    return max(float(np.max(np.abs(a - b))) for a, b in zip(after_h, after_r, strict=True))


def timed(
    update: Callable[[Any], Any], batches: Sequence[Any], n: int, start: int = 0
) -> tuple[float, float]:
    """(wall s, process CPU s) of ``n`` updates on the pool batches from ``start`` on, the
    garbage collector paused."""
    gc.collect()
    gc.disable()
    try:
        w0, c0 = time.perf_counter(), time.process_time()
        for i in range(start, start + n):
            update(batches[i % POOL])
        return time.perf_counter() - w0, time.process_time() - c0
    finally:
        gc.enable()


def warm_up(update: Callable[[Any], Any], batches: Sequence[Any], seconds: float) -> float:
    """Updates for about ``seconds``; the rate of the second half (caches and allocators
    warm), which runs as many updates as the first half took."""
    t_end = time.perf_counter() + seconds / 2
    n = 0
    while time.perf_counter() < t_end:
        update(batches[n % POOL])
        n += 1
    wall, _ = timed(update, batches, n, start=n)
    return n / wall


def cpu_jiffies() -> tuple[int, int, int]:
    """(idle, steal, total) jiffies of the whole machine since boot (/proc/stat): idle
    includes I/O wait; steal is time the hypervisor gave this VM's CPUs to someone else."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[3] + fields[4], fields[7], sum(fields[:8])


def versions(frameworks: Sequence[str]) -> dict[str, str]:
    """Python's, numpy's and the (already imported) frameworks' versions."""
    out = {"python": platform.python_version(), "numpy": np.__version__}
    return out | {name: sys.modules[name].__version__ for name in frameworks}


def machine() -> str:
    return f"{cpus_and_model()}, Linux {platform.release()}"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every (framework, case, implementation): setup, check, warm-up, interleaved blocks."""
    t_start = time.monotonic()
    header: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "load_start": os.getloadavg(),
        "blocks": args.blocks,
        "block_seconds": args.block_seconds,
        "warmup_seconds": args.warmup_seconds,
        "quick": args.quick,
        "command": args.command,
    }
    cfgs = configs()
    rng = np.random.default_rng(0)
    pools: dict[str, Sequence[Any]] = {
        "sac": replay_pool(cfgs["sac"].batch_size, rng),
        "ppo": rollout_pool(cfgs["ppo"].batch_size, rng),
    }
    raw_makers = {"torch": raw_torch, "paddle": raw_paddle}
    learners: dict[tuple[str, str, str], Learner] = {}
    checks: dict[str, float] = {}
    for fw in args.frameworks:
        backend = load_backend(fw)
        for case in CASES:
            h = harness_learner(case, backend, cfgs[case])
            r = raw_makers[fw](case, cfgs[case])
            checks[f"{fw}/{case}"] = check(fw, h, r, pools[case][0])
            learners[fw, case, "harness"], learners[fw, case, "raw"] = h, r
    header["versions"] = versions(args.frameworks)
    header["max_param_diff_after_one_update"] = checks
    gc.collect()
    gc.freeze()  # the frameworks' objects: the collection before each timed loop skips them
    halves: dict[tuple[str, str], int] = {}
    for key in learners:
        fw, case, impl = key
        rate = warm_up(learners[key].update, pools[case], args.warmup_seconds)
        print(f"  warm-up {fw}/{case}/{impl}: {rate:.1f} updates/s", file=sys.stderr, flush=True)
        if impl == "raw":  # harness and raw of a case run the same count per block
            halves[fw, case] = max(2, round(rate * args.block_seconds / 2))
    results: dict[str, dict[str, Any]] = {
        "/".join(key): {"n": 2 * halves[key[:2]], "wall_s": [], "cpu_s": []} for key in learners
    }
    cursor = dict.fromkeys(learners, 0)  # the next pool batch of each implementation
    pairs = list(halves)
    cpu0, own0, w0 = cpu_jiffies(), time.process_time(), time.monotonic()
    for block in range(args.blocks):
        first, second = IMPLS if block % 2 == 0 else IMPLS[::-1]
        for fw, case in pairs if block % 2 == 0 else pairs[::-1]:
            spent = {impl: [0.0, 0.0] for impl in IMPLS}
            for impl in (first, second, second, first):  # ABBA: a linear drift cancels
                key, n = (fw, case, impl), halves[fw, case]
                wall, cpu = timed(learners[key].update, pools[case], n, cursor[key])
                cursor[key] += n
                spent[impl][0] += wall
                spent[impl][1] += cpu
            for impl, (wall, cpu) in spent.items():
                results[f"{fw}/{case}/{impl}"]["wall_s"].append(wall)
                results[f"{fw}/{case}/{impl}"]["cpu_s"].append(cpu)
        line = ", ".join(
            f"{name}: {res['n'] / res['wall_s'][-1]:.1f}" for name, res in results.items()
        )
        print(f"  block {block + 1}/{args.blocks} updates/s: {line}", file=sys.stderr, flush=True)
    cpu1, elapsed = cpu_jiffies(), max(time.monotonic() - w0, 1e-9)
    idle, steal, total = (b - a for a, b in zip(cpu0, cpu1, strict=True))
    busy = (os.cpu_count() or 1) * (1 - (idle + steal) / max(1, total))
    own = (time.process_time() - own0) / elapsed
    header["others_cores"] = max(0.0, busy - own)
    header["steal"] = steal / max(1, total)
    header["load_end"] = os.getloadavg()
    header["total_s"] = time.monotonic() - t_start
    return {"header": header, "results": results}


# -- report -----------------------------------------------------------------------------------
def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


def report(saved: dict[str, Any]) -> str:
    """The markdown report of a run (:func:`measure`'s output, or a ``--json`` file)."""
    header, results = saved["header"], saved["results"]
    v = header["versions"]
    load0, load1 = header["load_start"], header["load_end"]
    frameworks = [fw for fw in FRAMEWORKS if f"{fw}/sac/raw" in results]
    lines = [
        f"bench_backends {header['date']}: {header['machine']}; Python {v['python']}, numpy "
        + v["numpy"]
        + "".join(f", {fw} {v[fw]}" for fw in frameworks)
        + "; 1 intra-op thread each; "
        f"{header['blocks']} blocks of {header['block_seconds']:g} s per implementation"
        + (" (--quick)" if header["quick"] else "")
        + f"; load average {load0[0]:.2f} at start, {load1[0]:.2f} at end; other processes kept "
        f"{header['others_cores']:.2f} cores busy during the blocks, the hypervisor took "
        f"{header.get('steal', 0.0):.1%} of the CPU time (steal); {header['total_s']:.0f} s",
        f"command: `{header['command']}`",
        "",
        "| case | backend | updates/s harness | updates/s raw | harness / raw, median of blocks "
        "(min-max) | in CPU time | target |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    raw_rates: dict[tuple[str, str], float] = {}
    for case in CASES:
        for fw in frameworks:
            h, r = results[f"{fw}/{case}/harness"], results[f"{fw}/{case}/raw"]
            rate_h = statistics.median(h["n"] / s for s in h["wall_s"])
            rate_r = statistics.median(r["n"] / s for s in r["wall_s"])
            raw_rates[fw, case] = rate_r
            ratio, lo, hi = spread(
                [b / a for a, b in zip(h["wall_s"], r["wall_s"], strict=True)]
            )  # same count per block: the rate ratio is the inverse time ratio
            ratio_cpu = statistics.median(
                b / a for a, b in zip(h["cpu_s"], r["cpu_s"], strict=True)
            )
            verdict = "met" if ratio >= TARGET else "**not met**"
            lines.append(
                f"| {CASE_TITLES[case]} | {fw} | {rate_h:,.1f} | {rate_r:,.1f} | "
                f"**{ratio:.3f}** ({lo:.3f}-{hi:.3f}) | {ratio_cpu:.3f} | >= {TARGET:.2f}: "
                f"{verdict} |"
            )
    lines.append("")
    diffs = header["max_param_diff_after_one_update"]
    lines.append(
        "Largest parameter difference between harness and the raw loop after one update from "
        "the same weights, batch and seed: "
        + ", ".join(f"{name} {value:.1e}" for name, value in diffs.items())
        + "."
    )
    lines += ["", "Per-block ratios harness / raw (wall time, in block order):", ""]
    for case in CASES:
        for fw in frameworks:
            h, r = results[f"{fw}/{case}/harness"], results[f"{fw}/{case}/raw"]
            ratios = [b / a for a, b in zip(h["wall_s"], r["wall_s"], strict=True)]
            lines.append(f"- {case.upper()} {fw}: " + " ".join(f"{x:.2f}" for x in ratios))
    lines.append("")
    if "torch" in frameworks and "paddle" in frameworks:
        lines.append(
            "paddle / torch, raw loops: "
            + ", ".join(
                f"{case.upper()} {raw_rates['paddle', case] / raw_rates['torch', case]:.2f}x"
                for case in CASES
            )
            + "."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run (~25 s)")
    p.add_argument("--blocks", type=int, help="interleaved blocks (default 20; quick 4)")
    p.add_argument(
        "--block-seconds", type=float, help="each implementation's share of a block (1.0; 0.4)"
    )
    p.add_argument(
        "--warmup-seconds", type=float, help="warm-up per implementation (2.0; quick 0.6)"
    )
    p.add_argument(
        "--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS), help="which"
    )
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--from-json", metavar="FILE", help="only print the report of a saved run")
    args = p.parse_args(argv)
    if args.from_json:
        print(report(json.loads(Path(args.from_json).read_text())))
        return 0
    args.blocks = args.blocks or (4 if args.quick else 20)
    args.block_seconds = args.block_seconds or (0.4 if args.quick else 1.0)
    args.warmup_seconds = args.warmup_seconds or (0.6 if args.quick else 2.0)
    given = argv if argv is not None else sys.argv[1:]
    args.command = " ".join([".venv/bin/python tools/bench_backends.py", *given])
    saved = measure(args)
    if args.json:
        Path(args.json).write_text(json.dumps(saved, indent=2))
    print(report(saved))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
