"""Experience storage for the harness: replay memories and on-policy rollout buffers.

Numpy only, so the core package imports without torch or gymnasium; agents convert sampled
batches to tensors themselves.
"""

from __future__ import annotations

from harness.data.prioritized import PrioritizedReplay, SumTree
from harness.data.replay import ReplayBatch, ReplayMemory
from harness.data.rollout import RolloutBatch, RolloutBuffer

__all__ = [
    "PrioritizedReplay",
    "ReplayBatch",
    "ReplayMemory",
    "RolloutBatch",
    "RolloutBuffer",
    "SumTree",
]
