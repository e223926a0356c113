"""The on-policy family's feed-forward / recurrent split lives in one place
(harness_algos.memory): chosen once from ``algo.recurrent``, called without branching."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.errors import ConfigError
from harness_algos.memory import FeedForward, FlatRollouts, Sequences, memory_for
from harness_algos.recurrent import AgentMemory

ALGOS = Path(__file__).resolve().parents[2] / "plugins" / "harness_algos"
FAMILY = ("onpolicy.py", "ppo.py", "impala.py", "a2c.py", "pg.py", "mappo.py")
BRANCH = re.compile(
    r'recurrent [!=]= "none"|memory is (not )?None|assert self\.memory|RecurrentPolicy\)'
)


def test_the_family_does_not_branch_on_recurrent() -> None:
    """Only IMPALA's refusal of images with a recurrent layer reads ``algo.recurrent``."""
    hits = [
        f"{name}:{number}: {line.strip()}"
        for name in FAMILY
        for number, line in enumerate((ALGOS / name).read_text().splitlines(), 1)
        if BRANCH.search(line)
    ]
    assert len(hits) == 1 and "if self.image and config.recurrent" in hits[0], hits


class Values:
    """A scorer whose value of an observation is its first entry (real arithmetic, no net)."""

    def values(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(obs[:, 0], np.float32)

    def sequence_values(self, obs: np.ndarray, starts: np.ndarray, state: np.ndarray) -> Any:
        return np.asarray(obs[..., 0], np.float32)


def test_memory_for_chooses_once_and_the_kinds_differ_where_they_must() -> None:
    flat, lstm = memory_for("none", 64), memory_for("lstm", 8)
    assert isinstance(flat, FeedForward) and flat.width == 0
    assert isinstance(lstm, Sequences) and lstm.width == 16  # an LSTM's (h, c) side by side
    assert isinstance(flat.rollouts(Values(), 3), FlatRollouts)
    rollouts = lstm.rollouts(Values(), 3)
    assert isinstance(rollouts, AgentMemory) and rollouts.rollout_start.shape == (3, 16)
    # the truncation bootstrap: at once for samples, deferred to the sequence pass otherwise
    final = np.array([[2.0, 0.0]], np.float32)
    rewards = np.ones(3, np.float32)
    flat.rollouts(Values(), 3).truncated(0, np.array([1]), final, rewards, 0.5)
    assert rewards.tolist() == [1.0, 2.0, 1.0]
    rollouts.truncated(0, np.array([1]), final, rewards, 0.5)
    assert rewards.tolist() == [1.0, 2.0, 1.0] and len(rollouts.truncations) == 1
    rollouts.clear()
    assert rollouts.truncations == []


def test_checkpoint_marks_refuse_the_other_kind() -> None:
    state: dict[str, object] = {}
    memory_for("gru", 8).mark(state)
    assert state == {"recurrent": "gru:8"}
    memory_for("gru", 8).check(state)
    with pytest.raises(ConfigError, match=r'trained with algo.recurrent = "gru", algo.rnn_hidden'):
        memory_for("none", 64).check(state)
    with pytest.raises(ConfigError, match=r'asks for algo.recurrent = "gru", algo.rnn_hidden = 8'):
        memory_for("gru", 8).check({})
