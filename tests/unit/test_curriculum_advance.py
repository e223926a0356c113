"""harness.curriculum.advance: a stage advances on a logged window's mean of its metric, never on
the mean of a window still filling (one iteration's dozen episodes just after a log). That real
runs log the key it waits for, and advance on it, tests/osim/test_packs.py and
tests/integration/test_myo_packs.py check (their curricula must reach stage 1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.curriculum import LOGGED, advance


@dataclass
class Options:
    """An env family's options with the four curriculum fields (as harness_myo's and
    harness_osim's declare them) and one staged option."""

    goal: float = 0.25
    kwargs: dict[str, Any] = field(default_factory=lambda: {"weights": 1.0})
    curriculum: list[dict[str, Any]] = field(
        default_factory=lambda: [{"goal": 0.25}, {"goal": 0.5, "kwargs": {"range": 2}}]
    )
    curriculum_metric: str = "score"
    curriculum_thresholds: list[float] = field(default_factory=lambda: [0.4])
    curriculum_stage: int = 0


class Config:
    def __init__(self) -> None:
        self.env = Options()


class Run:
    """What advance uses of a run: its config and update_env (which applies the changes to the
    options, as the runtime's does before it sends them to every env)."""

    def __init__(self) -> None:
        self.config = Config()
        self.step = 4096
        self.changes: list[dict[str, Any]] = []

    def update_env(self, **changes: Any) -> None:
        self.changes.append(changes)
        for key, value in changes.items():
            setattr(self.config.env, key, value)


def test_a_window_still_filling_does_not_advance_however_high_its_mean() -> None:
    run = Run()
    advance(run, {"charts/score": 0.9})
    assert run.changes == [] and run.config.env.curriculum_stage == 0


def test_a_logged_window_below_the_threshold_does_not_advance() -> None:
    run = Run()
    advance(run, {"charts/score": 0.39, LOGGED: 1000.0})
    assert run.changes == [] and run.config.env.curriculum_stage == 0


def test_a_logged_window_at_the_threshold_advances_and_merges_the_tables() -> None:
    run = Run()
    advance(run, {"charts/score": 0.4, LOGGED: 1000.0}, merge=("kwargs",))
    assert run.changes == [
        {"goal": 0.5, "kwargs": {"weights": 1.0, "range": 2}, "curriculum_stage": 1}
    ]
    advance(run, {"charts/score": 1.0, LOGGED: 2000.0})  # the last stage: nothing further
    assert len(run.changes) == 1 and run.config.env.curriculum_stage == 1
