"""harness.curriculum.advance: a stage advances on a logged window's mean of its metric, never on
the mean of a window still filling (one iteration's dozen episodes just after a log). That real
runs log the key it waits for, and advance on it, tests/osim/test_packs.py and
tests/integration/test_myo_packs.py check (their curricula must reach stage 1).

The core applies and advances the curriculum of any env family whose record declares one
(``EnvSpec.curriculum``), with no hook of the family's own: ``configure`` and ``iteration_end``
on a registry holding such a record."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from harness.curriculum import LOGGED, CurriculumSpec, advance, configure, iteration_end
from harness.errors import PluginError
from harness.registry import EnvSpec, Registry


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
        self.env = Options(goal=0.1)
        self.run = SimpleNamespace(env="Toy-v0")
        self.sources: dict[str, str] = {}


class Run:
    """What advance uses of a run: its config and update_env (which applies the changes to the
    options, as the runtime's does before it sends them to every env)."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.config = Config()
        self.registry = registry
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


def registry_with(curriculum: CurriculumSpec | None, config_cls: type[Any] = Options) -> Registry:
    """A registry holding one env family, a third party's: ``Toy-v0`` with these options."""
    registry = Registry()
    spec = EnvSpec(
        "toy",
        make_env=lambda *a, **k: None,
        accepts="Toy-v0".__eq__,
        config_cls=config_cls,
        curriculum=curriculum,
        plugin="toyplugin",
    )
    registry.envs.add(spec)
    return registry


def test_the_core_applies_and_advances_a_curriculum_its_env_family_declares() -> None:
    run = Run(registry_with(CurriculumSpec(merge=("kwargs",))))
    configure(run.config, run.registry)  # (at build time)
    assert run.config.env.goal == 0.25  # stage 0's options are in before any env is built
    iteration_end(run, {"charts/score": 0.4, LOGGED: 1000.0})
    assert run.changes == [
        {"goal": 0.5, "kwargs": {"weights": 1.0, "range": 2}, "curriculum_stage": 1}
    ]


def test_an_env_family_that_declares_no_curriculum_is_left_alone() -> None:
    run = Run(registry_with(None))
    configure(run.config, run.registry)
    iteration_end(run, {"charts/score": 1.0, LOGGED: 1000.0})
    assert run.config.env.goal == 0.1 and run.changes == []


def test_a_declared_curriculum_without_its_fields_names_the_plugin() -> None:
    @dataclass
    class Plain:
        goal: float = 0.1

    run = Run(registry_with(CurriculumSpec(), config_cls=Plain))
    with pytest.raises(PluginError, match=r"'toyplugin'.*curriculum_thresholds"):
        configure(run.config, run.registry)
