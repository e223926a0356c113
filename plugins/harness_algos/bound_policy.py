"""What every first-party :class:`~harness.policy.Policy` shares with its agent: it acts on the
agent's algorithm (whose numpy acting copies follow every weight change), so ``load`` is the
agent's ``set_weights`` and ``program`` the agent's ``policy_program``."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from harness.numpy_nets import PolicyProgram
from harness.policy import Policy


class BoundPolicy(Policy):
    """A policy bound to its agent: ``load`` loads the weights into it (the agent's
    ``set_weights``) and keeps their version; ``program`` is the agent's ``policy_program``
    (None: the policy cannot be exported)."""

    def __init__(
        self,
        load: Callable[[Mapping[str, np.ndarray]], None],
        program: Callable[[], PolicyProgram | None] | None = None,
    ) -> None:
        self._load, self._program = load, program

    def load(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        self._load(weights)
        self.version = version

    def program(self) -> PolicyProgram | None:
        return None if self._program is None else self._program()
