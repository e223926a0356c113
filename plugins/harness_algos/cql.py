"""CQL (Kumar et al. 2020), continuous actions: SAC's update on a fixed dataset plus the CQL(H)
penalty, which pushes the critics down on actions the dataset does not support and up on the
dataset's own:

    penalty = alpha' * (E_s[ T log sum_a exp(Q(s, a) / T) ] - E_(s,a)~D[ Q(s, a) ])

with the log-sum-exp estimated by importance sampling over ``cql_samples`` uniform actions and
as many policy actions at s and at s' (each corrected by its log-density, as in the authors'
code). alpha' is fixed (``cql_alpha``) or tuned by dual gradient descent so that the gap in
brackets stays at ``cql_target_gap`` (CQL-Lagrange). ``cql_alpha = 0`` trains plain SAC on the
dataset (no conservatism): the baseline the conservative methods are compared with.
Backend-neutral; SAC's update is sac.py's, the dataset and agent are offline.py's."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.api import Backend, EnvInfo, Tensor
from harness.data import ReplayBatch
from harness.policy import ActingParts
from harness_algos.offline import (
    OfflineAgent,
    OfflineConfig,
    OfflinePolicy,
    check_offline,
    per_state,
)
from harness_algos.offline import make_policy as offline_policy
from harness_algos.offpolicy import check_actor_critic
from harness_algos.sac import SAC, check_soft


@dataclass
class CQLConfig(OfflineConfig):
    """CQL hyper-parameters ([algo] section): SAC's keys, the dataset's and the penalty's.
    Defaults follow the authors' MuJoCo settings (critic learning rate 3e-4, 10 sampled
    actions per source, alpha' = 5)."""

    dataset: str | list[str] = ""
    """The Minari dataset to learn from: a path to a dataset directory (what `harness collect
    --out PATH` writes) or a dataset id (NAME-vN, NAMESPACE/NAME-vN) under dataset_root; a list
    pools several datasets of the same env."""
    dataset_root: str = ""
    """Directory in which dataset ids are looked up; empty: MINARI_DATASETS_PATH, else
    ~/.minari/datasets (Minari's own default). Paths in dataset are used as they are."""
    updates_per_iteration: int = 250
    """Gradient updates per iteration. An offline run steps no env: run.total_steps,
    eval_every, log_every and checkpoint_every count gradient updates."""
    learning_rate: float = 3e-4
    """Adam step size of every network (and of both coefficients)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target networks (1.0 = hard copy)."""
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden widths of the actor and of each critic."""
    activation: str = "relu"
    """Hidden activation: relu, tanh or elu."""
    autotune: bool = True
    """Learn the entropy coefficient (alpha) towards ``target_entropy``."""
    ent_coef: float = 1.0
    """Initial entropy coefficient (its fixed value when autotune is off)."""
    target_entropy: float | None = None
    """Entropy the tuning aims for; None = -(action dimensions)."""
    target_update_interval: int = 1
    """Gradient steps between soft target-critic updates."""
    cql_alpha: float = 5.0
    """Weight alpha' of the conservative penalty (its start value with cql_target_gap); 0
    trains plain SAC on the dataset."""
    cql_target_gap: float | None = None
    """Automatic alpha' (CQL-Lagrange): tune it so that the penalty's gap (log-sum-exp of Q
    minus Q of the data) stays at this value; None keeps alpha' fixed at cql_alpha."""
    cql_samples: int = 10
    """Actions per state and per source (uniform, policy at s, policy at s') in the
    log-sum-exp estimate."""
    cql_temperature: float = 1.0
    """Temperature T of the log-sum-exp."""

    def __post_init__(self) -> None:
        if self.cql_alpha < 0:
            raise ValueError(f"cql_alpha = {self.cql_alpha} must be >= 0")
        if self.cql_target_gap is not None and self.cql_alpha <= 0:
            raise ValueError("cql_target_gap needs cql_alpha > 0 (the start of the tuned weight)")
        if self.cql_samples < 1 or self.cql_temperature <= 0:
            raise ValueError("cql_samples must be >= 1 and cql_temperature > 0")
        check_soft(self.ent_coef, self.target_update_interval)
        check_actor_critic(self.batch_size, self.tau)
        check_offline(self.updates_per_iteration)


class CQL(SAC):
    """SAC with the conservative penalty on the critics' loss."""

    saved = (*SAC.saved, "log_alpha_prime", "alpha_prime_opt")
    config: CQLConfig

    def __init__(self, backend: Backend, info: EnvInfo, config: CQLConfig, *, seed: int) -> None:
        super().__init__(backend, info, config)
        start = math.log(config.cql_alpha) if config.cql_alpha > 0 else 0.0
        self.log_alpha_prime = backend.parameter(np.array([start], np.float32))
        self.alpha_prime_opt = backend.optimizer(self.log_alpha_prime, lr=config.learning_rate)
        self.rng = np.random.default_rng(seed)
        """Draws the uniform actions of the penalty (checkpointed)."""
        self._gap: Tensor | None = None

    @property
    def conservative(self) -> bool:
        return self.config.cql_alpha > 0

    def critic_penalty(
        self, obs: Tensor, next_obs: Tensor, q1: Tensor, q2: Tensor
    ) -> Tensor | None:
        if not self.conservative:
            return None
        bk, c = self.backend, self.config
        n, b, d = c.cql_samples, int(obs.shape[0]), self.act_dim
        with bk.no_grad():
            obs_n = bk.concat([obs] * n, axis=0)  # row k * b + i holds state i
            pi_actions, pi_log_p = self._sample_policy(obs_n)
            next_actions, next_log_p = self._sample_policy(bk.concat([next_obs] * n, axis=0))
            uniform = bk.tensor(self.rng.uniform(-1.0, 1.0, (n * b, d)).astype(np.float32))
            # importance weights: Q(s, a) - log density of a under its proposal
            log_density = bk.concat(
                [bk.tensor(np.full(n * b, -d * math.log(2.0), np.float32)), pi_log_p, next_log_p],
                axis=0,
            )
        states = bk.concat([obs_n, obs_n, obs_n], axis=0)
        actions = bk.concat([uniform, pi_actions, next_actions], axis=0)
        q1_all, q2_all = self.critics(bk.concat([states, actions]))
        t = c.cql_temperature

        def log_sum_exp(q_all: Tensor) -> Tensor:
            x = per_state(bk, (q_all[:, 0] - log_density) / t, b)  # (b, 3n)
            top = bk.max(x, axis=1)
            return t * (top + bk.log(bk.sum(bk.exp(x - top[:, None]), axis=1)))

        gap = 0.5 * (
            bk.mean(log_sum_exp(q1_all)) - bk.mean(q1[:, 0])
            + bk.mean(log_sum_exp(q2_all)) - bk.mean(q2[:, 0])
        )  # fmt: skip
        with bk.no_grad():
            self._gap = gap + 0.0  # (a copy outside the critics' graph)
            alpha_prime = bk.clip(bk.exp(self.log_alpha_prime), 0.0, 1e6)
        if c.cql_target_gap is None:
            return c.cql_alpha * gap
        return alpha_prime[0] * (gap - c.cql_target_gap)

    def learn(self, batch: ReplayBatch, *, diagnostics: bool = True) -> dict[str, float]:
        bk, c = self.backend, self.config
        self._gap = None
        metrics = super().learn(batch, diagnostics=diagnostics)
        gap = self._gap
        if gap is None:
            return metrics
        if c.cql_target_gap is not None:  # dual step: alpha' grows while the gap is too large
            bk.update(
                self.alpha_prime_opt, -bk.sum(self.log_alpha_prime * (gap - c.cql_target_gap))
            )
        if diagnostics:
            metrics["losses/cql_gap"] = bk.item(gap)
            if c.cql_target_gap is None:
                metrics["losses/cql_alpha"] = c.cql_alpha
            else:
                with bk.no_grad():
                    metrics["losses/cql_alpha"] = bk.item(bk.exp(self.log_alpha_prime)[0])
        return metrics

    def state(self) -> dict[str, Any]:
        return {**super().state(), "rng": self.rng.bit_generator.state}

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        self.rng.bit_generator.state = state["rng"]


def make_policy(parts: ActingParts) -> OfflinePolicy:
    """:func:`harness_algos.offline.make_policy` of CQL (an agent, or an agentless actor's
    :class:`~harness.policy.Acting`)."""
    return offline_policy(parts, "cql")


def make_algorithm(backend: Backend, info: EnvInfo, config: CQLConfig) -> CQL:
    """The algorithm alone (``AlgorithmSpec.make_algorithm``): :class:`CQL` as
    :func:`make_agent` builds it; ``seed`` 0 seeds the penalty's uniform actions, which
    acting never draws."""
    return CQL(backend, info, config, seed=0)


def make_agent(
    info: EnvInfo, backend: Backend, config: CQLConfig, *, seed: int = 0, total_steps: int = 1
) -> OfflineAgent:
    return OfflineAgent(
        CQL(backend, info, config, seed=seed),
        info,
        config,
        name="cql",
        seed=seed,
        total_steps=total_steps,
    )
