"""Discrete CQL (Kumar et al. 2020, the discrete-action variant): DQN's double-Q update on a
fixed dataset plus the CQL(H) penalty, which over a discrete space is exact,

    cql_alpha * E_(s,a)~D[ log sum_a' exp Q(s, a') - Q(s, a) ],

so Q is pushed down on every action and back up on the dataset's. Backend-neutral; the
update is dqn.py's, the dataset and agent are offline.py's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.api import Backend, EnvInfo, Tensor
from harness.data import ReplayBatch
from harness_algos.dqn import DQN, QConfig
from harness_algos.offline import OfflineAgent, OfflineConfig
from harness_algos.offpolicy import next_post_init


@dataclass
class CQLDiscreteConfig(QConfig, OfflineConfig):
    """Discrete CQL hyper-parameters ([algo] section): the Q update's (DQN's, with double
    Q-learning), the dataset's and the penalty's weight."""

    learning_rate: float = 1e-3
    """Adam step size."""
    cql_alpha: float = 1.0
    """Weight of the conservative penalty; 0 trains plain (double) DQN on the dataset."""

    def __post_init__(self) -> None:
        if self.cql_alpha < 0:
            raise ValueError(f"cql_alpha = {self.cql_alpha} must be >= 0")
        next_post_init(super())


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
