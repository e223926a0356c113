"""The ``harness tune`` loop: ask Optuna for a trial, train it (here or on a remote worker),
tell Optuna how it ended, until the study holds N COMPLETE or PRUNED trials.

Resuming is the same command again: the storage keeps every finished trial, and a trial left
RUNNING by a ``harness tune`` process that no longer exists on this host is marked FAIL (it
does not count), so a killed study continues where it stopped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from harness.config import Config, RawConfig, layer, resolve
from harness.errors import ConfigError, HarnessError
from harness.plugins import PluginSelection
from harness.registry import Registry
from harness_optuna.metrics import check_metric
from harness_optuna.space import (
    Param,
    TuneSettings,
    _copy,
    check_against_config,
    check_trials,
    params_to_sections,
    read_settings,
)
from harness_optuna.storage import default_storage, make_pruner, open_storage
from harness_optuna.trial import TrialJob, TrialOutcome, TrialWorker, run_trial

log = logging.getLogger(__name__)

OWNER_ATTR = "harness_owner"
MAX_CONSECUTIVE_FAILURES = 3
UNOWNED_GRACE = timedelta(seconds=60)


@dataclass
class TuneRequest:
    """What ``harness tune`` was asked to do (the command line, parsed)."""

    pack_file: Path
    configs: list[Path] = field(default_factory=list)
    sets: list[str] = field(default_factory=list)
    trials: int | None = None
    jobs: int = 1
    study: str | None = None
    storage: str | None = None
    pruner: str | None = None
    out: Path = Path("studies")
    cluster: str | None = None
    transport: str = "zmq"
    seed: int | None = None
    plugins: PluginSelection | None = None
    """The command's plugin selection (``-p``), which every trial loads; None: this
    process's environment's."""


@dataclass
class Prepared:
    """A validated request: settings, the layered config every trial starts from, the study."""

    request: TuneRequest
    settings: TuneSettings
    raw: RawConfig
    base: Config
    study_name: str
    study_dir: Path
    storage_url: str


def prepare(request: TuneRequest, registry: Registry) -> Prepared:
    """Validate everything (search space, config keys, pruner options) before any trial."""
    if request.jobs < 1:
        raise ConfigError(f"--jobs {request.jobs} must be >= 1.")
    registry.transports.get(request.transport)  # an unknown --transport fails here, named
    tune_raw = layer(request.pack_file, request.configs, []).raw_sections.get("tune", {})
    settings = read_settings(tune_raw, request.pack_file)
    if request.trials is not None:
        settings.trials = check_trials(request.trials, "--trials")
    if request.pruner is not None:
        settings.pruner = request.pruner
    raw = layer(request.pack_file, request.configs, [*settings.set, *request.sets])
    raw.merge({"run": {"progress": False}}, "harness tune")
    base = check_against_config(settings, raw, registry, request.pack_file)
    plugins = request.plugins or PluginSelection.from_environment()
    check_metric(settings.metric, raw, base, plugins, request.pack_file, registry)
    make_pruner(
        settings.pruner,
        settings.pruner_options.get(settings.pruner, {}),
        base.run.eval_every,
        base.run.total_steps,
    )
    pack = request.pack_file
    name = request.study or (pack.parent.name if pack.stem == "pack" else pack.stem)
    study_dir = request.out / name
    return Prepared(
        request, settings, raw, base, name, study_dir, request.storage or default_storage(study_dir)
    )


def distribution(param: Param) -> Any:
    import optuna.distributions as d

    low: Any = param.low
    high: Any = param.high
    if param.kind == "float":
        return d.FloatDistribution(low, high, log=param.log, step=param.step)
    if param.kind == "int":
        return d.IntDistribution(low, high, log=param.log, step=int(param.step or 1))
    return d.CategoricalDistribution(param.optuna_choices())


def open_study(prep: Prepared) -> Any:
    """Create or load the study; enqueue the pack's first trials into a new one."""
    import optuna

    prep.study_dir.mkdir(parents=True, exist_ok=True)
    storage = open_storage(prep.storage_url)
    s = prep.settings
    pruner = make_pruner(
        s.pruner, s.pruner_options.get(s.pruner, {}), prep.base.run.eval_every,
        prep.base.run.total_steps,
    )  # fmt: skip
    sampler = optuna.samplers.TPESampler(seed=prep.request.seed)
    try:
        study = optuna.create_study(
            study_name=prep.study_name,
            storage=storage,
            load_if_exists=True,
            direction="maximize" if s.direction == "maximize" else "minimize",
            sampler=sampler,
            pruner=pruner,
        )
    except ValueError as exc:
        raise HarnessError(
            f"Study {prep.study_name!r} in {prep.storage_url}: {exc}. Use another --study name "
            f"or the direction it was created with."
        ) from None
    if study.direction.name.lower() != s.direction:
        raise ConfigError(
            f"Study {prep.study_name!r} in {prep.storage_url} was created to "
            f"{study.direction.name.lower()}, but [tune] direction = {s.direction!r}. Use another "
            f"--study name."
        )
    if not study.trials:
        for params in s.enqueue:
            study.enqueue_trial({k: s.param(k).encode(v) for k, v in params.items()})
    return study


def fail_orphans(study: Any, now: datetime | None = None) -> list[int]:
    """Mark FAIL the RUNNING trials whose ``harness tune`` process is gone: started on this
    host by a pid that no longer runs, or never claimed by one for a minute. Trials owned by
    live processes or other hosts are left alone (they may be running right now)."""
    from optuna.trial import TrialState

    host = socket.gethostname()
    now = now or datetime.now()
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get(OWNER_ATTR)
        if owner is None:
            start = trial.datetime_start
            orphan = start is not None and now - start > UNOWNED_GRACE
        else:
            orphan = owner.get("host") == host and not _alive(int(owner.get("pid", -1)))
        if orphan:
            study.tell(trial.number, state=TrialState.FAIL)
            failed.append(trial.number)
    if failed:
        log.warning("trials %s were left RUNNING by a stopped harness tune: marked FAIL", failed)
    return failed


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def finished_count(study: Any) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


# ------------------------------------------------------------------------------------------
# Executors: where a trial runs


class InlineExecutor:
    """Trials in this process, one at a time (``--jobs 1`` without a cluster)."""

    def submit(self, job: TrialJob) -> Future[TrialOutcome]:
        future: Future[TrialOutcome] = Future()
        try:
            future.set_result(run_trial(job))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def done(self, future: Future[TrialOutcome]) -> None:
        pass

    def close(self) -> None:
        pass


class RemoteExecutor:
    """``jobs`` :class:`TrialWorker` actors on the embedded local farm or a cluster; a lost
    actor is replaced for the next trial."""

    def __init__(
        self,
        jobs: int,
        cluster: str | None,
        preload: list[str] | None = None,
        transport: str = "zmq",
    ) -> None:
        import harness
        from harness.remote import ActorOptions, RemoteClass

        cpus = max(jobs, os.cpu_count() or 1)
        # the local farm's actors are the only busy processes here (this one just waits):
        # no lower CPU priority for them (the farm's default, made for learner + actors); its
        # fork server imports what every trial needs once (torch, the plugins, optuna)
        options: dict[str, Any] = (
            {} if cluster else {"cpus": cpus, "actor_nice": 0, "preload": preload or []}
        )
        self.connection = harness.connect(cluster, transport=transport, **options)
        self.cls = RemoteClass(TrialWorker, ActorOptions(cpus=1))
        self.idle = [self.cls(_client=self.connection.client) for _ in range(jobs)]
        self.busy: dict[Future[TrialOutcome], Any] = {}

    def submit(self, job: TrialJob) -> Future[TrialOutcome]:
        worker = self.idle.pop()
        future: Future[TrialOutcome] = worker.run.future(job)
        self.busy[future] = worker
        return future

    def done(self, future: Future[TrialOutcome]) -> None:
        from harness.remote import ActorLost, release

        worker = self.busy.pop(future)
        if isinstance(future.exception(), ActorLost):
            release(worker)
            worker = self.cls(_client=self.connection.client)
        self.idle.append(worker)

    def close(self) -> None:
        self.connection.close()


# ------------------------------------------------------------------------------------------
# The loop


Notify = Callable[[str], None]


def run_study(prep: Prepared, registry: Registry, notify: Notify = log.info) -> Any:
    """Run trials until ``settings.trials`` are COMPLETE or PRUNED; returns the study."""
    req = prep.request
    starting: Future[RemoteExecutor] | None = None
    if req.jobs > 1 or req.cluster:
        # the trial workers start (fork server, imports, J actors: seconds) while this process
        # opens the study, and the report's plotting imports load while the trials run
        starter = ThreadPoolExecutor(1, thread_name_prefix="harness-tune-start")
        starting = starter.submit(
            RemoteExecutor, req.jobs, req.cluster, _trial_modules(prep, registry), req.transport
        )
        starter.shutdown(wait=False)
        threading.Thread(target=_warm_report_imports, daemon=True).start()
    try:
        study = open_study(prep)
        fail_orphans(study)
        target = prep.settings.trials
        done = finished_count(study)
    except BaseException:
        _close_when_started(starting)
        raise
    if done >= target:
        _close_when_started(starting)
        notify(f"study {prep.study_name!r} already has {done} finished trials (--trials {target})")
        return study
    notify(
        f"study {prep.study_name!r}: {done} of {target} trials finished; storage {prep.storage_url}"
    )
    executor: Any = InlineExecutor() if starting is None else starting.result()
    pending: dict[Future[TrialOutcome], TrialJob] = {}
    failures = 0
    try:
        while True:
            while len(pending) < req.jobs and done + len(pending) < target:
                job = _next_job(study, prep, registry, notify)
                if job is not None:
                    pending[executor.submit(job)] = job
            if not pending:
                break
            ready, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for future in ready:
                job = pending.pop(future)
                executor.done(future)
                ok = _finish(study, job, future, prep, notify)
                failures = 0 if ok else failures + 1
                if failures >= MAX_CONSECUTIVE_FAILURES:
                    raise HarnessError(
                        f"{failures} trials in a row failed (the last: trial {job.number}); "
                        f"stopping. Fix the cause above and rerun the same command to resume."
                    )
            done = finished_count(study)
    finally:
        _fail_pending(study, pending)
        if pending or starting is None:
            executor.close()
        else:  # every trial is told: the workers go down while the report is drawn
            threading.Thread(target=executor.close, name="harness-tune-close").start()
    return study


def _close_when_started(starting: Future[RemoteExecutor] | None) -> None:
    if starting is not None:
        with contextlib.suppress(Exception):
            starting.result().close()


def _warm_report_imports() -> None:
    """The report's plotting imports (~0.4 s here), done while remote trials run and this
    process only waits."""
    with contextlib.suppress(Exception):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot
        import optuna.visualization.matplotlib  # noqa: F401


def _trial_modules(prep: Prepared, registry: Registry) -> list[str]:
    """What a trial worker imports: the pack's plugins (and torch), optuna and this plugin."""
    from harness.runtime import preload_modules

    try:
        modules = preload_modules(resolve(_copy(prep.raw), registry), registry)
    except Exception:  # the pack alone does not resolve: the workers import as they go
        modules = []
    return [*modules, "optuna", "harness_optuna.trial"]


def _next_job(study: Any, prep: Prepared, registry: Registry, notify: Notify) -> TrialJob | None:
    """Ask for a trial and resolve its config; a sampled combination the config refuses is
    told FAIL (the sampler learns from it) and ``None`` returned."""
    from optuna.trial import TrialState

    s = prep.settings
    trial = study.ask({p.key: distribution(p) for p in s.space})
    trial.set_user_attr(OWNER_ATTR, {"host": socket.gethostname(), "pid": os.getpid()})
    params = {p.key: p.decode(trial.params[p.key]) for p in s.space}
    raw = _copy(prep.raw)
    raw.merge(params_to_sections(params), f"harness tune trial {trial.number}")
    trials_dir = (prep.study_dir / "trials").resolve()
    run = {"out": str(trials_dir), "name": f"trial_{trial.number:04d}"}
    raw.merge({"run": run}, "harness tune")
    try:
        config = resolve(raw, registry)
    except ConfigError as exc:
        trial.set_user_attr("error", str(exc))
        study.tell(trial, state=TrialState.FAIL)
        notify(f"trial {trial.number} FAIL: its sampled config is invalid: {exc}")
        return None
    trial.set_user_attr("config", config.to_dict())
    return TrialJob(
        study_name=prep.study_name,
        storage=prep.storage_url,
        trial_id=trial._trial_id,
        number=trial.number,
        config=config.to_dict(),
        metric=s.metric,
        direction=s.direction,
        objective=s.objective,
        pruner=s.pruner,
        pruner_options=s.pruner_options.get(s.pruner, {}),
        plugins=prep.request.plugins or PluginSelection.from_environment(),
    )


def _finish(
    study: Any, job: TrialJob, future: Future[TrialOutcome], prep: Prepared, notify: Notify
) -> bool:
    """Tell Optuna how the trial ended; False when it failed."""
    import math

    from optuna.trial import TrialState

    params = _shown_params(study, job.number)
    try:
        outcome = future.result()
    except Exception as exc:
        study.tell(job.number, state=TrialState.FAIL)
        notify(f"trial {job.number} FAIL ({params}): {type(exc).__name__}: {exc}")
        return False
    if outcome.pruned:
        study.tell(job.number, state=TrialState.PRUNED)
        notify(f"trial {job.number} PRUNED at {outcome.reported} reports ({params})")
        return True
    if math.isnan(outcome.value):
        study.tell(job.number, state=TrialState.FAIL)
        notify(
            f"trial {job.number} FAIL: no value of metric {job.metric!r} was reported; check "
            f"[tune] metric and run.eval_every/eval_episodes."
        )
        return False
    study.tell(job.number, outcome.value)
    notify(f"trial {job.number} COMPLETE value {outcome.value:.4g} ({params})")
    return True


def _shown_params(study: Any, number: int) -> str:
    trial = study.trials[number]
    return ", ".join(f"{k}={_short(v)}" for k, v in trial.params.items())


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _fail_pending(study: Any, pending: dict[Future[TrialOutcome], TrialJob]) -> None:
    """On an interrupt or error, trials still running here are FAIL (they do not count)."""
    from optuna.trial import TrialState

    for job in pending.values():
        try:
            study.tell(job.number, state=TrialState.FAIL)
        except Exception as exc:  # already finished, or the storage is gone
            log.debug("could not mark trial %d FAIL: %s", job.number, exc)


def base_pack_config(pack_file: Path, registry: Registry) -> Config:
    """The pack's own config (no --config/--set), the reference best.toml overrides."""
    return resolve(layer(pack_file, [], []), registry)
