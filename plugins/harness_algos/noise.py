"""Temporally correlated exploration for Gaussian policies (``algo.noise_correlation``).

A diagonal Gaussian policy acts ``mean + std * eps`` with a fresh ``eps ~ N(0, I)`` every
step. At a fast control rate (a musculoskeletal model at 100 Hz) such white noise averages out
within a few steps: muscles filter it away, and the body barely explores. Correlated
exploration keeps a perturbation for many steps instead: gSDE (Raffin et al., CoRL 2021),
coloured/pink noise (Eberhard et al., ICLR 2023) and Lattice (Chiappa et al., NeurIPS 2023, the
2023 MyoChallenge Relocate winners) all do, each its own way.

:class:`CorrelatedNoise` draws, per env, the stationary AR(1) process

    eps_t = rho * eps_{t-1} + sqrt(1 - rho^2) * z_t,    z_t ~ N(0, I)

which starts from ``eps_0 = z_0`` at each episode's start. Every ``eps_t`` is N(0, I), so the
policy's own Gaussian stays the (marginal) distribution of each action: its log-probability
and entropy are the ones the loss uses; only the steps of an episode are no longer independent
(a perturbation lasts about ``1 / (1 - rho)`` steps; ``rho = 0`` is white noise). Greedy
actions (evaluation, export) take no noise. The state is per env, so an agent with it keeps
per-env acting state, by row under central inference, and checkpoints it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class CorrelatedExploration(Protocol):
    """The ``[algo]`` key of the configs that offer correlated noise (PPO, IMPALA), declared
    with its docs in each; :class:`harness_algos.onpolicy.RolloutAgent` acts with white noise
    for a config without it (A2C, PG and MAPPO sample their own way)."""

    noise_correlation: float


def check_noise_correlation(rho: float) -> None:
    """``algo.noise_correlation`` must lie in [0, 1)."""
    if not 0.0 <= rho < 1.0:
        raise ValueError(
            f"noise_correlation = {rho} must be in [0, 1) (0: white noise; 0.9: a "
            "perturbation lasts about 10 steps)"
        )


class CorrelatedNoise:
    """Per-env AR(1) standard-normal noise of correlation ``rho`` for actions of ``width``
    dimensions (module docstring)."""

    def __init__(self, rho: float, width: int, num_envs: int) -> None:
        check_noise_correlation(rho)
        self.rho = float(rho)
        self.keep = float(np.sqrt(1.0 - rho * rho))
        """The weight of the fresh draw, so that each step's noise is N(0, I)."""
        self.width = width
        self.held = np.zeros((num_envs, width), np.float32)
        """Each env's last noise."""
        self.fresh = np.ones(num_envs, bool)
        """Envs whose next noise starts a new process (an episode started)."""

    def _envs(self, num_envs: int) -> None:
        if len(self.held) != num_envs:  # (a batch of another size, e.g. a conformance probe)
            self.held = np.zeros((num_envs, self.width), np.float32)
            self.fresh = np.ones(num_envs, bool)

    def draw(self, rng: np.random.Generator, num_envs: int) -> np.ndarray:
        """The next noise of all ``num_envs`` envs, ``(num_envs, width)``."""
        return self.draw_rows(rng, slice(0, num_envs), num_envs)

    def draw_rows(
        self, rng: np.random.Generator, rows: slice | np.ndarray, num_rows: int
    ) -> np.ndarray:
        """The next noise of rows ``rows`` of ``num_rows`` envs (a policy server's
        ``sample_rows``); the other rows keep theirs. Over all rows it draws what
        :meth:`draw` does."""
        self._envs(num_rows)
        held, fresh = self.held[rows], self.fresh[rows]
        z = rng.standard_normal(held.shape).astype(np.float32)
        noise = np.where(fresh[:, None], z, self.rho * held + self.keep * z).astype(np.float32)
        self.held[rows] = noise
        self.fresh[rows] = False
        return noise

    def ended(self, mask: np.ndarray) -> None:
        """``episodes_ended``: the envs in ``mask`` start a new process."""
        if len(mask) == len(self.fresh):
            self.fresh[np.asarray(mask, bool)] = True

    def rows_ended(self, rows: np.ndarray, num_rows: int) -> None:
        """``rows_ended``: rows ``rows`` of ``num_rows`` envs start a new process."""
        self._envs(num_rows)
        self.fresh[rows] = True

    def state(self) -> dict[str, np.ndarray]:
        return {"acting/noise": self.held.copy(), "acting/noise_fresh": self.fresh.copy()}

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        if "acting/noise" in state and "acting/noise_fresh" in state:
            self.held = np.array(state["acting/noise"], np.float32)
            self.fresh = np.array(state["acting/noise_fresh"], bool)
