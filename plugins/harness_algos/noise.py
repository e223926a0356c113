"""Temporally correlated exploration for Gaussian policies (``algo.noise_correlation``).

A diagonal Gaussian policy acts ``mean + std * eps`` with a fresh ``eps ~ N(0, I)`` every
step. At a fast control rate (a musculoskeletal model at 100 Hz) such white noise averages out
within a few steps: muscles filter it away, and the body barely explores. Correlated
exploration keeps a perturbation for many steps instead: gSDE (Raffin et al., CoRL 2021),
coloured/pink noise (Eberhard et al., ICLR 2023) and Lattice (Chiappa et al., NeurIPS 2023, the
2023 MyoChallenge Relocate winners) all do, each its own way.

The policy draws, per env, the stationary AR(1) process

    eps_t = rho * eps_{t-1} + sqrt(1 - rho^2) * z_t,    z_t ~ N(0, I)

which starts from ``eps_0 = z_0`` at each episode's start. Every ``eps_t`` is N(0, I), so the
policy's own Gaussian stays the (marginal) distribution of each action: its log-probability
and entropy are the ones the loss uses; only the steps of an episode are no longer independent
(a perturbation lasts about ``1 / (1 - rho)`` steps; ``rho = 0`` is white noise). Greedy
actions (evaluation, export) take no noise. The process's state (each env's last draw) is the
policy's state rows ``noise`` / ``noise_fresh``
(:class:`harness_algos.rollout_policy.RolloutPolicy`), kept by whoever steps the envs.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


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
