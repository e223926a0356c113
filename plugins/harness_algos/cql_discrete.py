"""Discrete CQL (Kumar et al. 2020, the discrete-action variant): DQN's double-Q update on a
fixed dataset plus the CQL(H) penalty, which over a discrete space is exact,

    cql_alpha * E_(s,a)~D[ log sum_a' exp Q(s, a') - Q(s, a) ],

so Q is pushed down on every action and back up on the dataset's. Backend-neutral; the
update is dqn.py's, the dataset and agent are offline.py's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.api import Backend, EnvInfo, Tensor
from harness.data import ReplayBatch
from harness.policy import ActingParts
from harness_algos.dqn import DQN, check_q
from harness_algos.offline import OfflineAgent, OfflineConfig, OfflinePolicy, check_offline
from harness_algos.offline import make_policy as offline_policy


@dataclass
class CQLDiscreteConfig(OfflineConfig):
    """Discrete CQL hyper-parameters ([algo] section): the Q update's (DQN's, with double
    Q-learning), the dataset's and the penalty's weight."""

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
    learning_rate: float = 1e-3
    """Adam step size."""
    batch_size: int = 64
    """Transitions per gradient step."""
    gamma: float = 0.99
    """Discount factor."""
    target_update_interval: int = 128
    """Gradient steps between hard target-network copies."""
    tau: float = 1.0
    """Target update rate (1.0 = hard copy every interval, <1 = Polyak averaging)."""
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the Q-network."""
    activation: str = "relu"
    """Hidden activation: relu, tanh or elu."""
    double: bool = True
    """Double Q-learning: the online net picks the next action, the target net scores it."""
    dueling: bool = False
    """Dueling head: Q = V + A - mean(A) over a shared trunk."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip."""
    loss: str = "huber"
    """TD loss: 'huber' or 'mse'."""
    cql_alpha: float = 1.0
    """Weight of the conservative penalty; 0 trains plain (double) DQN on the dataset."""

    def __post_init__(self) -> None:
        if self.cql_alpha < 0:
            raise ValueError(f"cql_alpha = {self.cql_alpha} must be >= 0")
        check_q(self.loss, self.batch_size, self.target_update_interval)
        check_offline(self.updates_per_iteration)


class CQLDiscrete(DQN):
    """DQN's TD loss plus the exact log-sum-exp penalty; target copies every
    ``target_update_interval`` updates."""

    config: CQLDiscreteConfig

    def __init__(self, backend: Backend, info: EnvInfo, config: CQLDiscreteConfig) -> None:
        super().__init__(backend, info, config)
        self.steps = 0
        self._gap: Tensor | None = None

    def act(self, obs: Any) -> Any:
        return self.greedy(obs)

    def q_penalty(self, q_all: Tensor, q_taken: Tensor) -> Tensor | None:
        if self.config.cql_alpha == 0:
            return None
        bk = self.backend
        top = bk.max(q_all, axis=-1)
        log_sum_exp = top + bk.log(bk.sum(bk.exp(q_all - top[:, None]), axis=-1))
        gap = bk.mean(log_sum_exp - q_taken)
        with bk.no_grad():
            self._gap = gap + 0.0  # (a copy outside the Q-network's graph)
        return self.config.cql_alpha * gap

    def learn(self, batch: ReplayBatch, *, diagnostics: bool = True) -> dict[str, float]:
        metrics, _ = self.learn_with_td(batch)
        self.steps += 1
        if self.steps % self.config.target_update_interval == 0:
            self.sync_target()
        if self._gap is not None:
            metrics["losses/cql_gap"] = self.backend.item(self._gap)
        return metrics

    def state(self) -> dict[str, Any]:
        return {**super().state(), "steps": self.steps}

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        self.steps = int(state["steps"])


def make_policy(parts: ActingParts) -> OfflinePolicy:
    """:func:`harness_algos.offline.make_policy` of discrete CQL (an agent, or an agentless
    actor's :class:`~harness.policy.Acting`)."""
    return offline_policy(parts, "cql-discrete")


def make_agent(
    info: EnvInfo,
    backend: Backend,
    config: CQLDiscreteConfig,
    *,
    seed: int = 0,
    total_steps: int = 1,
) -> OfflineAgent:
    return OfflineAgent(
        CQLDiscrete(backend, info, config),
        info,
        config,
        name="cql-discrete",
        seed=seed,
        total_steps=total_steps,
    )
