"""Env curricula: ``[env]`` option changes in stages, advanced on a logged episode metric.

An env family that offers a curriculum gives its ``[env]`` dataclass four fields
(``curriculum``, ``curriculum_metric``, ``curriculum_thresholds``, ``curriculum_stage``; see
``harness_osim``'s and ``harness_myo``'s configs for their docs) and declares it once, in its
record: ``EnvSpec(..., curriculum=CurriculumSpec(merge=...))``. The core does the rest, for every
env whose family declares one (no hook of the family's own):

* :func:`configure` at build time, right after the ``harness_configure`` hooks, runs
  :func:`apply_stage`: checks the stages and sets the current stage's options before any env is
  built (a resumed run starts at its saved stage);
* :func:`iteration_end` after each iteration, right before the ``harness_iteration_end`` hooks,
  runs :func:`advance`: when the window mean of the metric (as logged, ``charts/NAME``, on an
  iteration that logs its window) reaches the current stage's threshold, the next stage's
  options go to every env through ``Run.update_env`` (here, in every farm actor, in evaluation
  and replacement envs); the env family's ``configure`` applies them at each env's next episode.

:attr:`CurriculumSpec.merge` names options whose values are tables merged key by key into the
current value instead of replacing it (MyoSuite's constructor ``kwargs``: a stage changes the
goal ranges and keeps the reward weights).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import TYPE_CHECKING, Any

from harness.errors import ConfigError, PluginError
from harness.hookspecs import LOGGED_WINDOW as LOGGED

if TYPE_CHECKING:
    from harness.registry import Registry

log = logging.getLogger(__name__)

FIELDS = ("curriculum", "curriculum_metric", "curriculum_thresholds", "curriculum_stage")
"""The ``[env]`` fields a family with a curriculum declares."""


@dataclass(frozen=True)
class CurriculumSpec:
    """An env family's curriculum, declared in its record (``EnvSpec.curriculum``): the core
    applies the current stage at build time and advances it after iterations (see the module
    docstring). The family's ``[env]`` dataclass has the :data:`FIELDS`."""

    merge: tuple[str, ...] = ()
    """``[env]`` options whose values are tables a stage merges key by key into the current
    value instead of replacing it (harness_myo: ``("kwargs",)``)."""


def declared(registry: Registry, env_id: str) -> CurriculumSpec | None:
    """The curriculum the env family of ``env_id`` declares (``EnvSpec.curriculum``), or None;
    a :class:`harness.errors.PluginError` naming the plugin when its ``[env]`` dataclass lacks
    the :data:`FIELDS`."""
    spec = registry.env_for(env_id)
    if spec.curriculum is None:
        return None
    names = {f.name for f in fields(spec.config_cls)} if is_dataclass(spec.config_cls) else set()
    missing = [name for name in FIELDS if name not in names]
    if missing:
        raise PluginError(
            f"env family {spec.name!r} of plugin {spec.plugin or '?'!r} declares a curriculum, "
            f"but its [env] dataclass has no {', '.join(missing)}; add those fields "
            f"(harness.curriculum.FIELDS) or drop EnvSpec.curriculum."
        )
    return spec.curriculum


def configure(config: Any, registry: Registry) -> None:
    """At build time, after the ``harness_configure`` hooks: :func:`apply_stage` for an env
    whose family declares a curriculum."""
    curriculum = declared(registry, config.run.env)
    if curriculum is not None:
        apply_stage(config, curriculum.merge)


def iteration_end(run: Any, metrics: Mapping[str, float]) -> None:
    """After an iteration, before the ``harness_iteration_end`` hooks: :func:`advance` for an
    env whose family declares a curriculum."""
    curriculum = declared(run.registry, run.config.run.env)
    if curriculum is not None:
        advance(run, metrics, curriculum.merge)


def check(options: Any) -> None:
    """The stages against the options: one threshold per advance, stage keys that are
    options, a current stage that exists."""
    stages = options.curriculum
    if not stages:
        return
    if len(options.curriculum_thresholds) != len(stages) - 1:
        raise ConfigError(
            f"[env] curriculum has {len(stages)} stages, so curriculum_thresholds needs "
            f"{len(stages) - 1} values (one per advance), not {len(options.curriculum_thresholds)}."
        )
    names = {f.name for f in fields(options)} - set(FIELDS)
    for k, stage in enumerate(stages):
        unknown = sorted(set(stage) - names)
        if unknown:
            raise ConfigError(
                f"[env] curriculum stage {k} sets {', '.join(map(repr, unknown))}, which is not "
                f"an [env] option of this env (options: {', '.join(sorted(names))})."
            )
    if not 0 <= options.curriculum_stage < len(stages):
        raise ConfigError(
            f"[env] curriculum_stage = {options.curriculum_stage} is not a stage (0 to "
            f"{len(stages) - 1})."
        )


def stage_changes(options: Any, stage: int, merge: Collection[str] = ()) -> dict[str, Any]:
    """The option values stage ``stage`` sets (tables named in ``merge`` merged into the
    current ones)."""
    changes = dict(options.curriculum[stage])
    for key in merge:
        if key in changes:
            changes[key] = {**getattr(options, key), **changes[key]}
    return changes


def apply_stage(config: Any, merge: Collection[str] = ()) -> None:
    """Before the envs are built (:func:`configure`): check the curriculum and set the
    current stage's options on ``config.env``. A ``--set`` of an option the stage also sets is
    refused (the stage would silently win)."""
    options = config.env
    if not options.curriculum:
        return
    check(options)
    stage = options.curriculum_stage
    for key, value in stage_changes(options, stage, merge).items():
        origin = config.sources.get(f"env.{key}", "")
        if origin.startswith("--set") and getattr(options, key) != value and key not in merge:
            raise ConfigError(
                f"{origin} sets env.{key}, but the curriculum's stage {stage} sets it too "
                f"({key} = {value!r}), and the stage would win. Change it in the stage "
                f"(--set 'env.curriculum=[...]') or drop the curriculum (--set env.curriculum=[])."
            )
        setattr(options, key, value)


def advance(run: Any, metrics: Mapping[str, float], merge: Collection[str] = ()) -> None:
    """After an iteration (:func:`iteration_end`): go to the next stage when the logged
    window mean of the curriculum's metric reaches the current stage's threshold.

    Only iterations that log (``charts/episodes`` is in their metrics: every ``run.log_every``
    steps) count: the others carry the mean of a window still filling, which just after a log
    is one iteration's dozen episodes, and a stage would advance on a lucky draw (measured on
    Die Reorient: a 0.4 threshold passed while the logged success rate was 0.2)."""
    options = run.config.env
    if not options.curriculum or LOGGED not in metrics:
        return
    stage = options.curriculum_stage
    if stage >= len(options.curriculum_thresholds):
        return
    value = metrics.get(f"charts/{options.curriculum_metric}")
    if value is None or value < options.curriculum_thresholds[stage]:
        return
    changes = dict(stage_changes(options, stage + 1, merge), curriculum_stage=stage + 1)
    log.info(
        "curriculum: %s %.3g reached %.3g at step %d; stage %d -> %d",
        options.curriculum_metric,
        value,
        options.curriculum_thresholds[stage],
        run.step,
        stage,
        stage + 1,
    )
    run.update_env(**changes)
