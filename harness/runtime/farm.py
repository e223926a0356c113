"""The actor farm: remote actors step the envs with copies of the policy, the learner observes
their rollouts and broadcasts new weights with a version number.

Transport-neutral: actors are ``@harness.remote`` objects of whatever transport
``run.transport`` names (ZeroMQ by default; an embedded local farm when ``run.cluster`` is
empty). ``run.num_envs`` is split across ``run.actors``; every iteration each actor returns
one chunk of ``agent.rollout_len`` vector steps, and the learner observes them step by step in
actor order, so the agent sees exactly the layout a serial run with ``num_envs`` envs gives.

- Weights travel with the rollout requests: a request carries ``(version, weights,
  env_steps)`` when the actor does not have that version yet, else nothing, so a broadcast
  costs no extra messages or replies.
- On-policy agents (``agent.on_policy``) get every rollout from the newest weights: the next
  rollout is requested (with the weights) after the update.
- Off-policy agents let each actor run ``run.max_policy_lag`` rollouts ahead, so actors keep
  stepping while the learner learns; each chunk carries its weights version and the lag is
  reported.
- Agents whose ``observe`` takes each row of a transition on its own
  (``agent.independent_transitions``: one-step replay, DQN) are not held to that layout:
  their rollouts stream in arrival order, each observed as soon as it arrives as one batch
  of ``rollout_len x its envs`` rows, and the actor is asked for the next one at once. No
  actor waits for the slowest one (with hundreds of actors the slowest one of each round
  would otherwise set everyone's pace). One iteration is still ``rollout_len x num_envs`` env steps.
- Bounded inbox: at most ``actors * max(1, max_policy_lag)`` chunks are requested or held at
  any time (backpressure: a slow learner slows the actors, never grows memory).
- An actor that dies (``ActorLost``) is replaced, given the current weights and asked again;
  chunks are atomic, so a transition is observed exactly once or (if it never arrived) never.
- ``run.inference = "central"`` (or ``"auto"``'s choice, both decided at build time into the
  run's ``ActingPlan``, ``Run.acting``, which the farm reads): the actors hold no policy; a
  policy server in this process acts for all of them in batches
  (``harness.runtime.inference``). The weights then go to the server by version instead of
  with the rollout requests; everything above holds as it is.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.api import Agent, Transition, tree_map
from harness.config import Config
from harness.cpus import cpu_share
from harness.errors import ConfigError, HarnessError
from harness.plugins import PluginSelection, collect_registry, make_plugin_manager
from harness.policy import ActingParts, Policy, as_policy
from harness.remote import (
    ActorLost,
    ActorOptions,
    Client,
    RemoteClass,
    RemoteError,
    SupportsRemoteInference,
    SupportsReportMetrics,
    completions,
    qualified_name,
)
from harness.runtime.build import make_acting_or_agent, make_envs
from harness.runtime.collectors import Collector
from harness.runtime.inference import InferenceLink, Made, PolicyServer
from harness.runtime.moved import old_paths
from harness.runtime.spaces import env_info
from harness.runtime.stepper import (
    STEP_FIELDS,
    EnvFault,
    EnvStepper,
    Episode,
    chunk_transitions,
    configure_envs,
    env_label,
)
from harness.seeds import Seeds

if TYPE_CHECKING:
    from harness.registry import Registry
    from harness.runtime.state import Run

__all__ = [
    "MAX_RESTARTS_PER_ACTOR",
    "FarmCollector",
    "RolloutActor",
    "acting_config",
    "preload_modules",
    "server_config",
]

log = logging.getLogger(__name__)

__getattr__ = old_paths(
    __name__,
    dict.fromkeys(
        ("ACTOR_MEMORY_MB", "available_memory_mb", "check_actor_capacity"),
        "harness.runtime.build",
    ),
)
"""The memory check's old paths (``harness.runtime.farm.ACTOR_MEMORY_MB``, ...): it moved to
``harness.runtime.build`` with the other checks made before a run starts."""


MAX_RESTARTS_PER_ACTOR = 1000
"""A run whose actor keeps dying more often than this stops with an error (a crash loop)."""


def acting_config(config: Config) -> Config:
    """The run's config as a farm actor uses it: actors act on the CPU, so the learner's
    accelerator options (a backend config's ``device`` and ``amp``) are reset there."""
    backend = config.backend
    if not is_dataclass(backend) or isinstance(backend, type):
        return config
    names = {f.name for f in fields(backend)}
    changes = {k: v for k, v in (("device", "cpu"), ("amp", "off")) if k in names}
    if not changes:
        return config
    return replace(config, backend=replace(backend, **changes))


def server_config(config: Config) -> Config:
    """The run's config as the policy server of central inference uses it: with
    ``run.inference_device = 'learner'`` the learner's backend device (a GPU where the learner
    has one: one batched forward there instead of each actor's on the CPU) in float32 (AMP
    off: the actions and behaviour log-probs of a plain forward); with ``'cpu'`` an actor's
    (:func:`acting_config`)."""
    if config.run.inference_device == "cpu":
        return acting_config(config)
    backend = config.backend
    if not is_dataclass(backend) or isinstance(backend, type):
        return config
    if "amp" not in {f.name for f in fields(backend)}:
        return config
    return replace(config, backend=replace(backend, amp="off"))


class RolloutActor:
    """Lives in an actor process: a shard of the envs plus a :class:`harness.policy.Policy`
    (the stepper keeps its state rows, each broadcast is ``load``-ed into it), or, with
    central inference (``link``), a stand-in that asks the learner's policy server. The
    policy is made without an agent where the algorithm declares ``AlgorithmSpec.
    make_policy`` (every first-party one does): the algorithm's networks and the policy,
    no replay, optimiser state or learner counters; otherwise from an agent's ``policy()``.
    ``plugins`` is the learner's plugin selection (its ``-p`` flags and autoload switch):
    the actor loads exactly those plugins, whatever its own process environment says."""

    def __init__(
        self,
        config: Config,
        index: int,
        num_envs: int,
        seed: int,
        link: Any = None,
        plugins: PluginSelection | None = None,
    ) -> None:
        if plugins is not None:
            registry = plugins.registry(f"farm actor {index} (host {socket.gethostname()})")
        else:  # (built outside a farm: this process's own selection)
            registry = collect_registry(make_plugin_manager())
        config = acting_config(config)
        self.envs = make_envs(config, registry, num_envs, seed=None)
        # the policy server's stand-in (shared memory here, the transport's for remote actors)
        self.central = link.attach(index) if link is not None else None
        self.agent: Agent | None = None
        """The acting agent of an algorithm whose policy needs one (else None)."""
        self.acting: ActingParts | None = None
        """What the policy reads its schedules' env steps and its generator from."""
        self.policy: Policy | None = None
        if self.central is None:
            info = env_info(config.run.env, self.envs)
            rng = Seeds(seed).generator("exploration")
            made = make_acting_or_agent(config, registry, info, rng)
            if isinstance(made, Agent):
                self.agent = self.acting = made
                self.policy = as_policy(made)
            else:
                self.policy, self.acting = made
        label = f"{env_label(config.run.env, registry)} in farm actor {index}"
        self.stepper = EnvStepper(self.envs, Seeds(seed).seed("envs"), label=label)
        self.index = index
        self.version = -1
        self._ended = 0.0  # when the last rollout ended (perf_counter)

    def set_weights(self, version: int, weights: dict[str, np.ndarray], env_steps: int) -> None:
        if self.acting is None or self.policy is None:
            raise HarnessError("an actor with central inference holds no weights")
        self.policy.load(weights, version)
        self.acting.env_steps = env_steps  # exploration schedules follow the learner
        self.stepper.env_steps = env_steps  # (the step a fault names)
        self.version = version

    def rollout(
        self, steps: int, weights: tuple[int, dict[str, np.ndarray], int] | None = None
    ) -> dict[str, Any]:
        """``steps`` vector steps, after loading ``weights`` (``(version, weights,
        env_steps)``) when given; arrays are stacked time-major: ``(steps, num_envs, ...)``."""
        start = time.perf_counter()
        # between rollouts: the reply, the next request and any wait for the learner
        between = start - self._ended if self._ended else 0.0
        if weights is not None:
            self.set_weights(*weights)
        finished: list[Episode] = []
        if self.central is not None:
            self.central.begin_rollout()
            chunk = self.stepper.rollout(self.central, steps, finished)
            self.version = self.central.oldest_version  # the oldest weights that acted
        else:
            assert self.acting is not None and self.policy is not None
            chunk = self.stepper.rollout(self.policy, steps, finished)
            self.acting.env_steps += steps * self.stepper.n
        self._ended = time.perf_counter()
        chunk.update(
            index=self.index,
            version=self.version,
            episodes=finished,
            seconds=self._ended - start,
            between=between,
        )
        return chunk

    def configure_envs(self, changes: dict[str, Any]) -> None:
        """``configure(**changes)`` on this actor's envs (see ``Run.update_env``)."""
        configure_envs(self.envs, changes)

    def pid(self) -> int:
        """The actor's process id (tests and the monitor use it)."""
        return os.getpid()

    def close(self) -> None:
        if self.central is not None:
            self.central.close()
        self.envs.close()


def preload_modules(
    config: Config, registry: Registry, plugins: Iterable[str] | None = None
) -> list[str]:
    """Modules an embedded farm's actors should share with their fork server instead of each
    importing them (the plugins a run of ``config`` uses and the backend's framework, its
    ``BackendSpec.preload``: ~150 MB per actor and 1-2 s of start-up otherwise). ``plugins``:
    the plugin modules the run loaded (default: every entry point's; a blocked plugin must not
    be imported even by the fork server)."""
    from importlib.metadata import entry_points

    cfg = config.run
    modules = ["harness.runtime.farm", "harness.runtime.run", "harness.plugins"]
    # every plugin module: each actor (and each tune trial) discovers the plugins again
    if plugins is None:
        plugins = {ep.module for ep in entry_points(group="harness")}
    modules += sorted(set(plugins))
    backend = registry.backends.get(cfg.backend)
    for obj in (
        registry.algorithms.get(cfg.algo).make_agent,
        registry.env_for(cfg.env).make_env,
        backend.load,
    ):
        modules.append(obj.__module__)
    modules += backend.preload
    if registry.env_for(cfg.env).name == "gymnasium":
        modules.append("gymnasium")
    return modules


@dataclass
class _Slot:
    """One actor position: its proxy, its seed and the rollouts requested from it."""

    index: int
    num_envs: int
    seed: int
    """The actor's root seed before any restart (:meth:`Seeds.seed`, stream ``actor``)."""
    proxy: Any = None
    inflight: deque[Future[Any]] = field(default_factory=deque)
    sent_version: int = -1
    """The newest weights version sent to this actor (-1: none yet)."""
    restarts: int = 0
    steps_per_s: float = 0.0
    received_steps: int = 0


class FarmCollector(Collector):
    """Experience from remote actors (see the module docstring), the collector of a run with
    ``run.actors > 0``."""

    def __init__(self, run: Run) -> None:
        cfg = run.config.run
        self.config = run.config
        self.agent = run.agent
        self.plugins = run.pm.selection  # every actor loads the learner's plugin set
        self.steps = run.agent.rollout_len
        self.lag = 0 if run.agent.on_policy else max(0, cfg.max_policy_lag)
        options: dict[str, Any] = {}
        if cfg.cluster_keys:
            options["keys"] = cfg.cluster_keys
        if not cfg.cluster:
            loaded = [info.module for info in run.pm.infos.values()]
            options["preload"] = preload_modules(run.config, run.registry, loaded)
            # a local farm (or local Ray) sized for every actor of this run: more actors
            # than cores is oversubscription the user asked for (a Ray sized to the cores
            # would never place the rest)
            options["cpus"] = max(cfg.actors, cpu_share())
        spec = run.registry.transports.get(cfg.transport)
        self.client: Client = spec.connect(cfg.cluster or None, **options)
        # (checked once: an isinstance against a Protocol costs ~10 us)
        self.reporter = self.client if isinstance(self.client, SupportsReportMetrics) else None
        self.actor_cls = RemoteClass(
            RolloutActor, ActorOptions(cpus=1.0, memory_mb=cfg.actor_memory_mb or None)
        )
        sizes = np.array_split(np.arange(cfg.num_envs), cfg.actors)
        self.seeds = Seeds(cfg.seed)
        self.start_step = run.step  # (a resumed run's actors play new episodes)
        self.slots = [
            _Slot(i, len(s), self.seeds.seed("actor", i, 0, run.step)) for i, s in enumerate(sizes)
        ]
        self.version = 0
        self._weights: tuple[int, dict[str, np.ndarray], int] | None = None
        """The newest weights as sent, taken from the agent once per version."""
        self.restarts = 0
        self.received_steps = 0
        self.lost_rollouts = 0
        self._device_at = -1e9  # when the learner's device stats were last looked up
        self._device: dict[str, float] = {}
        self.lags: list[int] = []
        self._scores: deque[float] = deque(maxlen=20)  # the newest episodes' official scores
        self._stepped = 0  # env steps in the rollouts received since the last metrics
        self._stepping = 0.0  # actor seconds spent in those rollouts
        self._between = 0.0  # ... and between rollouts (reply, request, waiting for us)
        self.stream = not run.agent.on_policy and run.agent.independent_transitions
        self._arrivals = completions(self.client)  # stream mode: rollouts as they finish
        self.server: PolicyServer | None = None
        self.relay: Any = None
        """With central inference for remote actors: the transport's relay into the server."""
        self._link: Any = None
        """What every actor is given to attach to the policy server (None: acts itself)."""
        plan = self.acting = run.acting
        """Where the actions are computed: the run's plan (decided at build time)."""
        try:
            if plan.central:
                self.server = PolicyServer(
                    lambda: self._server_acting(run),
                    [s.num_envs for s in self.slots],
                    by_rows=plan.by_rows,
                    wait_s=plan.wait_s,
                )
                self._link = self.server.link
                if plan.relay:
                    self.relay = self._relay(self.server.link)
                    self._link = self.relay.link
            with ThreadPoolExecutor(max_workers=min(len(self.slots), 32)) as pool:
                list(pool.map(self._start, self.slots))
        except RemoteError as exc:  # an actor's ConfigError (a -p plugin it lacks): bad input
            self.close()
            bad_input = exc.as_bad_input()
            if bad_input is exc:
                raise
            raise bad_input from exc
        except BaseException:
            self.close()
            raise
        log.info(
            "actor farm: %d actors over %s, %d envs; acting %s (%s)",
            len(self.slots),
            cfg.cluster or "an embedded local farm",
            cfg.num_envs,
            (
                f"on a central policy server ({self.server.device}"
                + (f", remote actors through {self.relay.link.endpoint}" if self.relay else "")
                + ")"
                if self.server is not None
                else "per actor"
            ),
            plan.why,
        )

    def _relay(self, link: InferenceLink) -> Any:
        """The transport's relay of remote actors' requests into the server's arrays."""
        if not isinstance(self.client, SupportsRemoteInference):
            raise ConfigError(
                f"run.inference = 'central' with remote actors (run.cluster) needs a transport "
                f"that relays their observations to the policy server, and run.transport = "
                f"{self.config.run.transport!r} does not. Use run.transport = 'zmq', or "
                "run.inference = 'actor'."
            )
        return self.client.serve_inference(link)

    def _server_acting(self, run: Run) -> Made:
        """The policy server's acting policy (on the learner's device or the CPU:
        :func:`server_config`) for every env of the farm, made from the algorithm alone where
        it declares ``AlgorithmSpec.make_policy`` (as a per-actor actor's), else an agent's;
        its exploration generator is the farm's own."""
        config = server_config(self.config)
        rng = Seeds(config.run.seed).generator("exploration", run.step)
        learner = run.agent.backend
        state = learner.rng_state()  # building seeds the framework: keep the learner's draws
        try:
            return make_acting_or_agent(config, run.registry, run.info, rng)
        finally:
            learner.set_rng_state(state)

    # -- actors --------------------------------------------------------------------------
    def _start(self, slot: _Slot) -> None:
        seed = self.seeds.seed("actor", slot.index, slot.restarts, self.start_step)
        slot.proxy = self.actor_cls(
            self.config,
            slot.index,
            slot.num_envs,
            seed,
            self._link,
            self.plugins,
            _client=self.client,
        )
        slot.sent_version = -1  # the first rollout request carries the weights

    def _replace(self, slot: _Slot, error: BaseException) -> None:
        slot.restarts += 1
        self.restarts += 1
        if slot.restarts > MAX_RESTARTS_PER_ACTOR:
            raise HarnessError(
                f"actor {slot.index} died {slot.restarts} times; last error: {error}"
            ) from error
        log.warning("actor %d lost (%s); starting a replacement", slot.index, error)
        self.lost_rollouts += len(slot.inflight)  # requested (the failed one too), never delivered
        slot.inflight.clear()
        try:
            from harness.remote import release

            release(slot.proxy)
        except Exception:  # already gone
            pass
        self._start(slot)

    def _top_up(self, slot: _Slot, depth: int) -> None:
        server = self.server
        if server is not None and server.published != self.version:
            # before the request: an on-policy rollout is acted by this version throughout
            server.publish(self.version, self.agent.weights(), self.agent.env_steps)
        while len(slot.inflight) < depth:
            weights = None
            if server is None and slot.sent_version != self.version:
                if self._weights is None:
                    self._weights = (self.version, self.agent.weights(), self.agent.env_steps)
                weights = self._weights
                slot.sent_version = self.version
            future = slot.proxy.rollout.future(self.steps, weights)
            slot.inflight.append(future)
            if self.stream:
                self._arrivals.add(future, slot)

    def _next_chunk(self, slot: _Slot) -> dict[str, Any]:
        while True:
            self._top_up(slot, max(1, self.lag))
            try:
                chunk: dict[str, Any] = self._result(slot.inflight[0])
                slot.inflight.popleft()
            except ActorLost as exc:
                self._replace(slot, exc)
                continue
            if self.lag:
                self._top_up(slot, self.lag)  # keep stepping while the learner learns
            self._received(slot, chunk)
            return chunk

    def _result(self, future: Future[Any]) -> Any:
        """``future``'s result; with a policy server, its health is checked while waiting (a
        server that gave up would leave every actor waiting for actions forever)."""
        if self.server is None:
            return future.result()
        while True:
            try:
                return future.result(timeout=1.0)
            except TimeoutError:
                self._check_server()

    def _check_server(self) -> None:
        if self.server is not None:
            self.server.check()
        if self.relay is not None:
            self.relay.check()

    def _received(self, slot: _Slot, chunk: dict[str, Any]) -> None:
        self.lags.append(self.version - int(chunk["version"]))
        slot.steps_per_s = self.steps * slot.num_envs / max(chunk["seconds"], 1e-9)
        self._stepped += self.steps * slot.num_envs
        slot.received_steps += self.steps * slot.num_envs
        self._stepping += float(chunk["seconds"])
        self._between += float(chunk.get("between", 0.0))

    def _stream(self, run: Run, finished: list[Episode]) -> None:
        """Observe rollouts in arrival order until one iteration's worth of env steps."""
        depth = max(1, self.lag)
        for slot in self.slots:
            self._top_up(slot, depth)
        wanted = self.steps * self.config.run.num_envs
        got = 0
        while got < wanted:
            try:
                future, slot = self._arrivals.next(None if self.server is None else 1.0)
            except TimeoutError:
                self._check_server()
                continue
            if not slot.inflight or slot.inflight[0] is not future:
                continue  # a request of a replaced actor (counted as lost)
            try:
                chunk: dict[str, Any] = future.result()
            except ActorLost as exc:
                self._replace(slot, exc)
                self._top_up(slot, depth)
                continue
            slot.inflight.popleft()
            self._top_up(slot, depth)  # it steps on while this chunk is observed
            self._received(slot, chunk)
            got += self._observe_rows(run, chunk, finished)

    def _observe_rows(self, run: Run, chunk: dict[str, Any], finished: list[Episode]) -> int:
        """Observe a chunk as one batch of ``steps x envs`` rows in time order (an agent with
        independent transitions takes any number of rows); returns the row count."""
        finished.extend((float(r), int(n), dict(m)) for r, n, m in chunk["episodes"])
        done = chunk["terminated"]  # (steps, envs) in single- and multi-agent envs alike
        rows = int(done.shape[0] * done.shape[1])

        def flat(a: np.ndarray) -> np.ndarray:
            return a.reshape(rows, *a.shape[2:])

        fields = [tree_map(flat, chunk[name]) for name in STEP_FIELDS]
        extras = {key: flat(value) for key, value in chunk["extras"].items()}
        run.agent.observe(Transition(*fields, extras))  # type: ignore[call-arg]
        run.step += rows
        self.received_steps += rows
        return rows

    def _observe(
        self,
        run: Run,
        chunks: list[dict[str, Any]],
        width: int,
        finished: list[Episode],
    ) -> None:
        """Observe ``chunks`` side by side (their envs concatenated), step by step
        (:func:`~harness.runtime.stepper.chunk_transitions`)."""
        for chunk in chunks:
            finished.extend((float(r), int(n), dict(m)) for r, n, m in chunk["episodes"])
        for transition in chunk_transitions(chunks):
            run.agent.observe(transition)
            run.step += width
        self.received_steps += self.steps * width

    def update_env(self, config: Config, changes: dict[str, Any]) -> None:
        """New ``[env]`` options: every actor configures its envs; replacements are built with
        ``config``."""
        self.config = config
        pending = [(slot, slot.proxy.configure_envs.future(changes)) for slot in self.slots]
        for slot, future in pending:  # (each actor first finishes the rollouts it has queued)
            try:
                future.result()
            except ActorLost as exc:
                self._replace(slot, exc)  # (built with the new options)

    # -- the collector interface ---------------------------------------------------------
    def collect(self, run: Run, finished: list[Episode]) -> None:
        before = len(finished)
        try:
            if self.stream:
                self._stream(run, finished)
            else:
                # every actor's request goes out before the first result is awaited: the actors
                # step their rollouts at once (requesting each in turn as the last one's result
                # came in stepped them one at a time: N actors at one actor's rate)
                depth = max(1, self.lag)
                for slot in self.slots:
                    self._top_up(slot, depth)
                chunks = [self._next_chunk(slot) for slot in self.slots]
                self._observe(run, chunks, self.config.run.num_envs, finished)
        except RemoteError as exc:
            if exc.remote_type == qualified_name(EnvFault):  # its paragraph, as in a serial run
                raise EnvFault(exc.remote_message) from exc
            bad_input = exc.as_bad_input()  # (an actor's ConfigError: reported as one here)
            if bad_input is exc:
                raise
            raise bad_input from exc
        for _, _, episode_metrics in finished[before:]:  # the official score, for the monitor
            if "score" in episode_metrics:
                self._scores.append(float(episode_metrics["score"]))

    def after_learn(self, run: Run) -> dict[str, float]:
        self.version += 1
        self._weights = None  # taken from the agent when the first request needs them
        rates = [s.steps_per_s for s in self.slots]
        metrics = {
            "farm/actors": float(len(self.slots)),
            "farm/weights_version": float(self.version),
            "farm/policy_lag": float(np.mean(self.lags)) if self.lags else 0.0,
            "farm/policy_lag_max": float(max(self.lags, default=0)),
            "farm/actor_restarts": float(self.restarts),
            "farm/lost_rollouts": float(self.lost_rollouts),
            "farm/received_steps": float(self.received_steps),
            "farm/inbox": float(sum(len(s.inflight) for s in self.slots)),
            "farm/actor_sps_min": float(min(rates)),
            # steps over seconds (a mean of per-chunk rates would favour the quick chunks)
            "farm/actor_sps_mean": self._stepped / max(self._stepping, 1e-9),
            "farm/actor_idle": self._between / max(self._stepping + self._between, 1e-9),
        }
        if self.server is not None:
            metrics.update(self.server.stats())
        if self.relay is not None:
            metrics.update(self.relay.stats())
        self.lags.clear()
        self._stepping = self._between = 0.0
        self._stepped = 0
        if self.reporter is not None:
            shown = {
                "steps_per_s": metrics["farm/actor_sps_mean"] * len(self.slots),
                "policy_lag": metrics["farm/policy_lag"],
                "inbox": metrics["farm/inbox"],
                "dropped": metrics["farm/lost_rollouts"],
                # the cluster monitor's live charts: a point per new step
                "step": run.step,
            }
            if run.recent:
                shown["episode_return"] = run.recent_return
            if self._scores:
                shown["score"] = float(np.mean(self._scores))
            self.reporter.report_metrics({**shown, **self._learner_device(run)})
        return metrics

    def _learner_device(self, run: Run) -> dict[str, float]:
        """The learner's accelerator for the cluster monitor, looked up at most once per
        second (an NVML query per learner iteration would cost more than the iteration)."""
        now = time.monotonic()
        if now - self._device_at >= 1.0:
            self._device_at = now
            stats = run.agent.backend.device_stats()
            keys = {
                "gpu/util": "gpu_util",
                "gpu/memory_used_mb": "gpu_memory_used_mb",
                "gpu/memory_total_mb": "gpu_memory_total_mb",
                "gpu/torch_allocated_mb": "gpu_torch_mb",
            }
            self._device = {short: float(stats[key]) for key, short in keys.items() if key in stats}
        return self._device

    def close(self) -> None:
        self._arrivals.close()
        if self.relay is not None:  # (its socket lives in the client's context)
            self.relay.close()
        try:
            self.client.close()
        except Exception:  # closing must not hide the error that ended the run
            log.exception("closing the actor farm's connection failed")
        if self.server is not None:  # after the actors: none is left waiting for actions
            self.server.close()
