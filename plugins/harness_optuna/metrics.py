"""Which metrics a pack reports, found before the first trial, so a misspelled ``[tune]
metric`` fails at once with a "did you mean" instead of after three trials that report
nothing.

The names that every run reports are known without running anything, and so is the official
score (``eval/score``) of an env whose family declares evaluation protocols (their score is
that episode metric). Any other name is looked up in a dry run: one training iteration and
one evaluation episode of the pack's config, serial, in a temporary directory, with every
metric key the run hands to its plugins collected (``harness_iteration_end`` and the
summary's last evaluation). That is the same code a trial runs, so what it reports is what
trials report: the algorithm's ``losses/``, the env's episode metrics as ``charts/NAME`` and
``eval/NAME`` (a plugin's ``eval/correct`` included), ``perf/`` and device stats.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import hookimpl
from harness.config import Config, RawConfig, resolve
from harness.errors import ConfigError, HarnessError, did_you_mean
from harness.plugins import PluginSelection, collect_registry
from harness.registry import Registry

log = logging.getLogger(__name__)

ALWAYS = frozenset(
    {
        "charts/episodic_return",
        "charts/episodic_length",
        "charts/episodes",
        "eval/mean_return",
        "eval/std_return",
        "perf/SPS",
    }
)
"""What every run reports (the ``eval/`` ones with evaluations on)."""

UNCHECKED_PREFIXES = ("farm/", "gpu/")
"""Reported only by a farm (``run.actors > 0``) or on a GPU: not in a serial dry run."""


class _Collect:
    """Gathers every metric key the dry run hands to plugins."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Mapping[str, float]) -> None:
        self.names.update(metrics)

    @hookimpl
    def harness_run_end(self, run: Any, summary: Mapping[str, Any]) -> None:
        self.names.update(summary.get("final_eval_metrics", {}))


def check_metric(
    metric: str,
    raw: RawConfig,
    base: Config,
    plugins: PluginSelection,
    pack_file: Path,
    registry: Registry,
) -> None:
    """Refuse ``metric`` unless the pack reports it (see the module docstring)."""
    where = f"{pack_file}: [tune] metric {metric!r}"
    if metric.startswith("eval/") and base.run.eval_episodes <= 0:
        raise ConfigError(
            f"{where} needs evaluations, but run.eval_episodes = {base.run.eval_episodes}. "
            "Set it > 0 (and run.eval_every > 0 for pruning)."
        )
    if metric in ALWAYS or metric.startswith(UNCHECKED_PREFIXES):
        return
    if metric in ("eval/score", "charts/score") and _has_protocols(base.run.env, registry):
        return  # (an env with evaluation protocols reports its official score: declared)
    names = reported_metrics(raw, plugins)
    if names is None or metric in names:
        return
    if metric.startswith("losses/") and not any(n.startswith("losses/") for n in names):
        # an off-policy learner reports no losses before learning_starts: nothing to check
        log.warning("%s: cannot be checked before the trials (no loss in one iteration)", where)
        return
    shown = ", ".join(sorted(names))
    raise ConfigError(
        f"{where} is not a metric this pack reports.{did_you_mean(metric, names)} A dry run of "
        f"one iteration and one evaluation episode of {base.run.algo} on {base.run.env} "
        f"reported: {shown}. Set [tune] metric to one of them (episode metrics of the env "
        "appear as charts/NAME and eval/NAME)."
    )


def _has_protocols(env_id: str, registry: Registry) -> bool:
    spec = registry.env_for(env_id)
    return spec.protocols is not None and bool(spec.protocols(env_id))


def reported_metrics(raw: RawConfig, plugins: PluginSelection) -> set[str] | None:
    """Every metric key a one-iteration dry run of ``raw`` reports, or None when the dry run
    failed on something other than bad input (the trials will show it). An episode metric
    is named under ``charts/`` too: the evaluation's episode always ends, a training one may
    not within one iteration."""
    from harness.runtime import train

    pm = plugins.manager()
    registry = collect_registry(pm)
    collect = _Collect()
    pm.register(collect, name="harness-tune-metric-check")
    with tempfile.TemporaryDirectory(prefix="harness-tune-metrics-") as tmp:
        probe = RawConfig(
            sections={k: dict(v) for k, v in raw.sections.items()},
            sources=dict(raw.sources),
            algo_of=dict(raw.algo_of),
        )
        dry: dict[str, Any] = {
            "total_steps": 1,  # one iteration: the loop runs until the budget is passed
            "eval_every": 0,
            "eval_episodes": 1,
            "checkpoint_every": 0,
            "log_every": 0,
            "stop_at_return": None,
            "keep_best": False,
            "max_seconds": 0.0,
            "actors": 0,
            "trackers": [],
            "progress": False,
            "out": tmp,
        }
        probe.merge({"run": dry}, "harness tune metric check")
        config = resolve(probe, registry)
        try:
            with warnings.catch_warnings():  # (the dry run's own, e.g. an empty plot legend)
                warnings.simplefilter("ignore")
                train(config, registry, pm)
        except HarnessError:
            raise  # (bad input every trial would meet: reported now)
        except Exception as exc:  # the check is a convenience; the trials will show it
            log.warning("the dry run that checks [tune] metric failed: %s", exc)
            return None
    names = set(collect.names) | ALWAYS
    per_run = {"eval/mean_return", "eval/std_return", "eval/confirm_mean_return"}
    names |= {"charts/" + n[5:] for n in names if n.startswith("eval/") and n not in per_run}
    return names
