"""QMIX's episode replay (plugins/harness_algos/qmix.py): fixed-length sequences of
multi-agent steps, each with the agents' actions and hidden states before its first step, so
training replays a sequence from the state the agents acted from."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class EpisodeReplay:
    """Fixed-length sequences ``(capacity, seq_len, ...)`` with masks, filled circularly."""

    FIELDS = ("obs", "actions", "rewards", "terminated", "mask", "prev_actions", "initial_state")
    ADDED = ("initial_state",)
    """Fields newer than some checkpoints (initial_state: issue 28): zeros where a data state
    lacks them, the zero start training used before."""

    def __init__(
        self, capacity: int, seq_len: int, num_agents: int, obs_dim: int, state_width: int = 0
    ) -> None:
        cap, length, a = capacity, seq_len, num_agents
        self.capacity = capacity
        self.obs = np.zeros((cap, length + 1, a, obs_dim), np.float32)
        self.actions = np.zeros((cap, length, a), np.int64)
        self.rewards = np.zeros((cap, length), np.float32)
        self.terminated = np.zeros((cap, length), np.float32)
        self.mask = np.zeros((cap, length), np.float32)
        self.prev_actions = np.full((cap, a), -1, np.int64)
        """Each agent's action before the sequence's first step (-1: it starts an episode)."""
        self.initial_state = np.zeros((cap, a, state_width), np.float32)
        """Each agent's acting hidden state before the sequence's first step (zeros: it starts
        an episode; width 0 for a feed-forward agent)."""
        self.pos = 0
        self.size = 0

    def add(self, **sequence: np.ndarray) -> None:
        i = self.pos
        for name in self.FIELDS:
            getattr(self, name)[i] = sequence[name]
        self.pos = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def state(self) -> dict[str, np.ndarray]:
        out = {f"replay/{name}": getattr(self, name)[: self.size] for name in self.FIELDS}
        out["replay/counters"] = np.array([self.pos, self.size], np.int64)
        return out

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        self.pos, self.size = (int(v) for v in state["replay/counters"])
        for name in self.FIELDS:
            key = f"replay/{name}"
            if key in state or name not in self.ADDED:
                getattr(self, name)[: self.size] = state[key]
            else:  # written before the field existed: the zero start training used then
                getattr(self, name)[: self.size] = 0
