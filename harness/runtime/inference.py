"""Central (batched) inference for the farm: ``run.inference = "central"``.

Per-actor acting (``"actor"``, the default) runs a copy of the policy in every actor, one
small batch (that actor's envs) at a time. With central inference the actors only step their
envs; a :class:`PolicyServer` in the learner process holds the one acting policy (made from
the algorithm's weights, no agent, where the algorithm declares ``AlgorithmSpec.make_policy``),
gathers the observations of every actor that is waiting, runs ONE ``Policy.act`` over them
and hands each actor its rows of the actions and extras (behaviour log-probs included, so
V-trace corrects for the policy that really acted). Sample Factory's policy workers and SEED
RL's central inference, as an option of the same farm. Which of the two a run has (or that
it has no farm) is decided once, at build time, into an ``ActingPlan``
(``harness.runtime.acting.plan_acting``, whose refusals are start-up checks); the farm and
the server read it::

    actor 0 (envs 0-3) --obs--> [ obs rows 0-3 ] --+
    actor 1 (envs 4-7) --obs--> [ obs rows 4-7 ] --+--> policy.act(batch, state rows)
    ...                                                 (policy server thread)
                                                         --> [actions, extras]
    actor i <-- its rows of actions/extras, woken by one byte on its reply FIFO ---------+

How the parts talk (all on this host; actors on other hosts reach the same arrays through
their transport's relay, :class:`harness.remote.SupportsRemoteInference`: the ZeroMQ one
writes their requests into their rows exactly as a local actor does):

- **Shared memory**: one ``.npy`` memory map per array in a private directory (``/dev/shm``
  where there is one): ``obs`` ``(num_envs, *obs_shape)``, ``actions``, one per extra,
  ``ended`` ``(num_envs,)`` int8 (episode-end flags, for per-env acting state) and
  ``control`` ``(actors, 4)`` int64 (request sequence number, answered sequence number,
  weights version that answered, the first request of the actor now in the slot). Actor
  ``i`` owns rows ``offsets[i]:offsets[i+1]``, fixed for the run: an actor writes its
  observations once, the server reads whole runs of neighbouring actors as views (every
  actor waiting: the whole array, no copy at all) and writes the answers back in place. No
  pickling.
- **Wake-ups**: FIFOs. An actor writes its index (4 bytes: atomic on a pipe) to the shared
  ``requests`` FIFO; the server reads every waiting index at once (that is the batch) and
  writes one byte to each answered actor's ``reply-i`` FIFO. Both sides open FIFOs
  read-write, so neither blocks at open nor sees end-of-file when the other end dies.
- **Exactly once**: the sequence numbers in ``control`` say which request is open; a
  wake-up byte is only a hint. A replaced actor continues its slot's sequence, so a stale
  answer for its dead predecessor is never taken for its own; a restarted server first
  answers every open request (no actor is left waiting on a lost wake-up).
- **Weights** reach the server by version (:meth:`PolicyServer.publish`, from the farm as
  they reach per-actor actors): applied before the next batch, so on-policy rollouts
  (requested after the publish) are acted by the newest version throughout, and a chunk's
  ``version`` is the oldest version that answered any of its steps.
- **Exploration state** lives with the server's :class:`~harness.policy.ActingParts` (an
  :class:`~harness.policy.Acting`, or an agent where the algorithm needs one): its ``rng``
  and ``env_steps``, the learner's count with the weights acting (set with each published
  version, fixed between versions): an epsilon or a warm-up moves with the weights, never
  inside a batch, and a farm whose learner publishes before each rollout (on-policy, or an
  off-policy one that learns every rollout) reads the schedule a per-actor actor and a serial
  run read, the count before that rollout (a per-actor actor also counts its own rollouts
  between broadcasts; the server, serving every actor, leaves that to the learner).
- **Per-env acting state** (a :class:`~harness.policy.Policy`'s state rows: a recurrent
  hidden state, correlated noise) lives in the server, one array per state key with a row
  per env of the farm (``PolicyServer.state``): a batch acts on its rows only, so each env's
  state is used and advanced by its own steps, whichever actors share a batch, and written
  back last (a failed batch leaves them as they were; a replacement agent's policy goes on
  from them). An actor's episode ends set its rows' flags in ``ended``; the server resets
  those rows (``Policy.reset``) before it acts for them and clears the flags (the actor
  writes them only while it has no request open, so the two never race). A new actor in a
  slot (a replaced one: fresh envs) writes its first request's sequence number to
  ``control``; the server resets all its rows when it answers that request, not before (a
  predecessor's stale request may still be answered first, by sequence number as always).
  An agent written before ``Policy`` is served through ``sample``, or by row through
  ``sample_rows`` / ``rows_ended`` (:attr:`~harness.api.Agent.acts_by_rows`); one with other
  per-env state is refused (:func:`central_refusal`).

- **Gathering** (``run.inference_wait_ms``): once a request arrived, the server may wait a
  little for more (until every actor's is in) before the batch: fewer wake-ups of the
  server, bigger batches (256 actors of a 20 ms env: 52-56% -> 61-67% of the ideal at 3 ms
  in three runs; where the cores are not all busy it only adds latency: default 0).

The server is a thread of the learner process: its forward releases the GIL (numpy matrix
products, torch ops), and it needs no second copy of the framework's memory or start-up
(a 10x shorter GIL switch interval changed nothing measurable: no contention to remove).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import Agent
from harness.errors import HarnessError
from harness.policy import ActingParts, Policy, State, own_policy

log = logging.getLogger(__name__)

REQUEST, ANSWERED, VERSION, STARTED = 0, 1, 2, 3
"""Columns of the ``control`` array: the newest request's sequence number, the sequence
number answered, the weights version that answered it, and the sequence number of the first
request of the actor now in the slot (its envs are fresh from that request on)."""
_STOP = np.int32(-1).tobytes()
"""The record that tells the server thread to end."""
MAX_SERVER_RESTARTS = 100
"""A policy server that fails more often than this stops the run with its error."""

# ------------------------------------------------------------------------------------------
# the shared arrays


@dataclass(frozen=True)
class InferenceLink:
    """What an actor needs to attach to a :class:`PolicyServer` (a few bytes, picklable)."""

    directory: str
    """The directory of the shared arrays and FIFOs."""
    offsets: tuple[int, ...]
    """Actor ``i``'s rows are ``offsets[i]:offsets[i + 1]``."""
    extras: tuple[str, ...]
    """The names of ``sample``'s extras, in the order of their files ``extra-J.npy``."""
    by_rows: bool = False
    """The server keeps per-env acting state by row: actors report their episode ends."""

    def attach(self, index: int, blocking: bool = True) -> CentralActing:
        """Actor ``index``'s stand-in for the agent (in the actor's process; a remote actor's
        link, from the transport's :meth:`~harness.remote.SupportsRemoteInference.serve_inference`,
        attaches over the network instead)."""
        return CentralActing(self, index, blocking)


class _Arrays:
    """The memory-mapped arrays of a link (created by the server, opened by actors), as plain
    ndarray views of the maps: indexing an ``np.memmap`` goes through its Python-level
    ``__getitem__`` and ``__array_finalize__`` (measured ~2 us each, 7 per actor step)."""

    def __init__(self, link: InferenceLink) -> None:
        d = Path(link.directory)

        def view(name: str) -> np.ndarray:
            return np.asarray(np.lib.format.open_memmap(d / name, mode="r+"))

        self.obs = view("obs.npy")
        self.actions = view("actions.npy")
        self.extras = {name: view(f"extra-{j}.npy") for j, name in enumerate(link.extras)}
        self.ended = view("ended.npy")
        self.control = view("control.npy")


def _create(path: Path, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape).flush()


def _shm_root() -> str | None:
    """``/dev/shm`` where there is one (a RAM file system: the maps never touch a disk)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def batch_rows(offsets: np.ndarray, ids: np.ndarray) -> slice | np.ndarray:
    """The shared arrays' rows of actors ``ids`` (sorted, unique), actor ``i`` owning
    ``offsets[i]:offsets[i + 1]``: a slice when they are neighbours (every actor waiting: the
    batch is a view, no copy), else the row indices in actor order, for one gather and one
    scatter per array (a Python loop over runs of neighbours cost ~3 us per actor, ~1 ms a
    batch with 256 actors)."""
    starts, stops = offsets[ids], offsets[ids + 1]
    if np.array_equal(starts[1:], stops[:-1]):
        return slice(int(starts[0]), int(stops[-1]))
    lengths = stops - starts
    rows: np.ndarray = np.arange(int(lengths.sum())) + np.repeat(
        starts - (np.cumsum(lengths) - lengths), lengths
    )
    return rows


# ------------------------------------------------------------------------------------------
# the actor's side


class CentralActing:
    """An actor's stand-in for the agent (what :class:`~harness.runtime.stepper.EnvStepper`
    calls): ``sample`` writes the observations into this actor's rows, wakes the server and
    waits for its answer. Per-env acting state lives on the server: this side reports its
    episode ends and, by existing, that its envs are fresh (module docstring)."""

    def __init__(self, link: InferenceLink, index: int, blocking: bool = True) -> None:
        self.index = index
        self.rows = slice(link.offsets[index], link.offsets[index + 1])
        self.arrays = _Arrays(link)
        d = Path(link.directory)
        self._requests = os.open(d / "requests", os.O_RDWR)
        self._reply = os.open(d / f"reply-{index}", os.O_RDWR | os.O_NONBLOCK)
        with contextlib.suppress(BlockingIOError):  # wake-ups meant for a predecessor
            while os.read(self._reply, 4096):
                pass
        os.set_blocking(self._reply, blocking)
        self._record = np.int32(index).tobytes()
        # continue the slot's sequence: a predecessor's open request is never ours
        self.seq = int(self.arrays.control[index, REQUEST])
        self._by_rows = link.by_rows
        # fresh envs: the server resets this slot's rows at our first request (not at a
        # predecessor's stale one, which it may still answer)
        self.arrays.control[index, STARTED] = self.seq + 1
        self.oldest_version = -1
        """The oldest weights version that answered since :meth:`begin_rollout` (-1: none)."""

    def begin_rollout(self) -> None:
        self.oldest_version = -1

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        self.submit(obs)
        return self.receive()

    def submit(self, obs: np.ndarray) -> None:
        """Ask for the actions of ``obs`` without waiting (:meth:`receive` takes them)."""
        a = self.arrays
        a.obs[self.rows] = obs
        self.seq += 1
        # after the observations: the server reads them after this
        a.control[self.index, REQUEST] = self.seq
        os.write(self._requests, self._record)

    def fileno(self) -> int:
        """The reply FIFO: readable when the server answered (or a stale wake-up came)."""
        return self._reply

    def poll(self) -> tuple[np.ndarray, dict[str, np.ndarray], int] | None:
        """Without blocking: the answer to the last :meth:`submit` as views of the shared
        arrays (valid until the next submit) and the weights version that gave it, or None
        while it is open. For a relay serving remote actors (it waits on :meth:`fileno`)."""
        with contextlib.suppress(BlockingIOError):
            os.read(self._reply, 4096)
        a = self.arrays
        control = a.control[self.index]
        if control[ANSWERED] != self.seq:
            return None
        extras = {name: value[self.rows] for name, value in a.extras.items()}
        return a.actions[self.rows], extras, int(control[VERSION])

    def receive(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The answer to the last :meth:`submit` (blocks until the server gave it)."""
        a = self.arrays
        control = a.control[self.index]
        while control[ANSWERED] != self.seq:
            os.read(self._reply, 64)  # blocks until a wake-up (a stale one: look again)
        version = int(control[VERSION])
        if self.oldest_version < 0 or version < self.oldest_version:
            self.oldest_version = version
        # copies: the next answer overwrites these rows while the caller may keep them
        extras = {name: value[self.rows].copy() for name, value in a.extras.items()}
        return a.actions[self.rows].copy(), extras

    def episodes_ended(self, mask: np.ndarray) -> None:
        """Flag this actor's rows whose episodes ended: the server resets their state before
        it samples them next (only where it keeps per-env state: ``link.by_rows``)."""
        if self._by_rows:
            flags = self.arrays.ended[self.rows]  # a view: written in place
            flags[np.asarray(mask, bool)] = 1

    def close(self) -> None:
        for fd in (self._requests, self._reply):
            with contextlib.suppress(OSError):
                os.close(fd)


# ------------------------------------------------------------------------------------------
# the server


Made = Agent | tuple[Policy, ActingParts]
"""What a policy server's ``make`` gives: a policy and the parts it reads (made without an
agent: :func:`harness.runtime.build.make_acting`), or an agent (whose ``policy()`` the
server acts through, or whose ``sample`` / ``sample_rows`` where it has no policy of its
own: an agent written before :class:`~harness.policy.Policy`)."""


def serving(made: Made) -> tuple[Policy | None, ActingParts, Agent | None]:
    """The policy (None: served through the agent's hooks), its parts and the agent (None: no
    agent) of what a server's ``make`` gave."""
    if isinstance(made, Agent):
        return own_policy(made), made, made
    policy, parts = made
    return policy, parts, None


class PolicyServer:
    """The acting policy serving a farm's actors in batches (module docstring).

    ``make`` builds a fresh policy and its parts (:data:`Made`): the first one, and the
    replacement after a failure (the newest published weights are loaded into it and every
    open request is answered, so the actors, attached to the shared arrays, carry on).
    ``by_rows`` and ``wait_s`` are the run's :class:`ActingPlan`'s (:attr:`ActingPlan.by_rows`,
    :attr:`ActingPlan.wait_s`): the server serves as planned and decides nothing."""

    def __init__(
        self,
        make: Callable[[], Made],
        sizes: list[int],
        *,
        by_rows: bool,
        wait_s: float = 0.0,
    ) -> None:
        self._make = make
        self.wait_s = wait_s
        """How long a batch waits for more requests once one arrived (``run.inference_wait_ms``)."""
        self.policy: Policy | None
        """The policy acting (None: an agent acting through ``sample``, served through it)."""
        self.parts: ActingParts
        """What the policy reads: its generator and the learner's env-step count."""
        self.agent: Agent | None
        """The acting agent where the algorithm needs one to act (None: the policy alone)."""
        self.policy, self.parts, self.agent = serving(make())
        self.device = str(self.parts.algorithm.backend.device)
        """Where the acting policy's framework forward runs (``run.inference_device``)."""
        self.by_rows = by_rows
        """The policy keeps per-env acting state by row (or an agent, ``sample_rows``)."""
        info = self.parts.env_info
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        rows = int(self.offsets[-1])
        self.state: State = {} if self.policy is None else self.policy.initial_state(rows)
        """The policy's state rows of every env of the farm (the server's, not the agent's:
        a replacement agent's policy goes on from them)."""
        obs_shape = tuple(info.observation.shape)
        obs_dtype = np.dtype(info.observation.dtype)
        actions, extras = self._probe(np.zeros((1, *obs_shape), obs_dtype))
        self.directory = tempfile.mkdtemp(prefix="harness-inference-", dir=_shm_root())
        d = Path(self.directory)
        names = tuple(extras)
        _create(d / "obs.npy", (rows, *obs_shape), obs_dtype)
        _create(d / "actions.npy", (rows, *actions.shape[1:]), actions.dtype)
        for j, name in enumerate(names):
            value = np.asarray(extras[name])
            _create(d / f"extra-{j}.npy", (rows, *value.shape[1:]), value.dtype)
        _create(d / "ended.npy", (rows,), np.dtype(np.int8))
        _create(d / "control.npy", (len(sizes), 4), np.dtype(np.int64))
        os.mkfifo(d / "requests", 0o600)
        for i in range(len(sizes)):
            os.mkfifo(d / f"reply-{i}", 0o600)
        self.link = InferenceLink(
            self.directory, tuple(int(o) for o in self.offsets), names, self.by_rows
        )
        self._started = np.zeros(len(sizes), np.int64)
        """Per slot: the ``STARTED`` request whose fresh envs this server has reset."""
        self.arrays = _Arrays(self.link)
        self._requests = os.open(d / "requests", os.O_RDWR)
        self._replies = [
            os.open(d / f"reply-{i}", os.O_RDWR | os.O_NONBLOCK) for i in range(len(sizes))
        ]
        self.version = -1
        """The weights version acting now (-1: none published yet)."""
        self.published = -1
        """The newest version handed to :meth:`publish`."""
        self._pending: tuple[int, Mapping[str, np.ndarray], int] | None = None
        self._current: tuple[int, Mapping[str, np.ndarray], int] | None = None
        self._lock = threading.Lock()
        self.restarts = 0
        self.error: BaseException | None = None
        self._stopping = False
        self._batches = self._rows = 0
        self._busy = 0.0  # seconds inside sample() since the last stats()
        self._since = time.perf_counter()
        self._cpu_now = self._cpu_then = 0.0  # the server thread's CPU seconds (thread_time)
        self._thread = threading.Thread(target=self._main, name="policy-server", daemon=True)
        self._thread.start()

    def _probe(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One exploring act on a dummy observation: the shapes and dtypes of the actions and
        extras. The generator is put back, so the probe draws nothing for real."""
        state = self.parts.rng.bit_generator.state
        try:
            if self.policy is None:
                actions, extras = self._hooks().sample(obs)
            else:
                one = self.policy.initial_state(1)
                actions, extras, _ = self.policy.act(obs, one, explore=True)
        finally:
            self.parts.rng.bit_generator.state = state
        return np.asarray(actions), {k: np.asarray(v) for k, v in extras.items()}

    def _hooks(self) -> Agent:
        """The agent whose acting hooks serve (there is one where :attr:`policy` is None)."""
        assert self.agent is not None
        return self.agent

    # -- the farm's side -------------------------------------------------------------------
    def publish(self, version: int, weights: Mapping[str, np.ndarray], env_steps: int) -> None:
        """New weights: the server acts with them from its next batch on."""
        with self._lock:
            self._pending = (version, weights, env_steps)
            self.published = version

    def check(self) -> None:
        """Raise the error that stopped the server for good (the farm waits on actors that
        it would otherwise leave waiting forever)."""
        if self.error is not None:
            raise HarnessError(
                f"the policy server (run.inference = central) failed {self.restarts} times; "
                f"last error: {self.error!r}"
            ) from self.error

    def stats(self) -> dict[str, float]:
        """``farm/inference_*`` metrics since the last call: mean batch size (rows), batches
        per second, the fraction of the time spent in ``sample``, the server thread's CPU
        seconds per second (``inference_cpu``: on a loaded machine ``busy`` counts the time it
        waited for a core too; CPU seconds per row is what the forward costs), restarts."""
        now = time.perf_counter()
        span = max(now - self._since, 1e-9)
        cpu, self._cpu_then = self._cpu_now - self._cpu_then, self._cpu_now
        out = {
            "farm/inference_batch": self._rows / max(self._batches, 1),
            "farm/inference_batches_per_s": self._batches / span,
            "farm/inference_busy": self._busy / span,
            "farm/inference_cpu": max(cpu, 0.0) / span,
            "farm/inference_cpu_us_per_row": 1e6 * max(cpu, 0.0) / max(self._rows, 1),
            "farm/inference_restarts": float(self.restarts),
            "farm/inference_on_accelerator": float(self.device != "cpu"),
        }
        self._batches = self._rows = 0
        self._busy = 0.0
        self._since = now
        return out

    def close(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._requests, _STOP)
        self._thread.join(timeout=10)
        for fd in (self._requests, *self._replies):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- the server thread -----------------------------------------------------------------
    def _main(self) -> None:
        while not self._stopping:
            try:
                self._serve()
                return
            except Exception as exc:  # replaced, as a farm replaces a lost actor
                if self._stopping:
                    return
                self.restarts += 1
                if self.restarts > MAX_SERVER_RESTARTS:
                    log.error("policy server failed %d times; giving up", self.restarts)
                    self.error = exc
                    return
                log.warning("policy server failed (%r); starting a replacement", exc)
                self._replace()

    def _replace(self) -> None:
        old, rng = self.agent, self.parts.rng
        self.policy, self.parts, self.agent = serving(self._make())
        self.parts.rng.bit_generator.state = rng.bit_generator.state
        # (a policy acts on from self.state: nothing to carry; an agent's own rows are)
        if self.by_rows and self.policy is None and old is not None:
            self._carry_rows(old)
        with self._lock:
            if self._pending is None and self._current is not None:
                self._pending = self._current  # loaded into the new agent at its first batch

    def _carry_rows(self, old: Agent) -> None:
        """The per-env acting states of a failed server's agent, into its replacement: the
        failure came inside a batch (``sample_rows`` writes the states last, so they are
        those of the last answered steps), and the open requests are answered again from
        them. Where they cannot be read, every row starts from a fresh state, said in the
        log: the actors' episodes go on, acted from zero states the learner does not
        replay from (V-trace and PPO's clip then see a policy that differs from theirs)."""
        try:
            self._hooks().load_data_state(old.data_state())
        except Exception as exc:
            log.warning(
                "policy server: the failed agent's per-env acting states could not be carried "
                "over (%r); every env's state starts from zeros",
                exc,
            )

    def _serve(self) -> None:
        self._answer(np.arange(len(self._replies)))  # every request left open (a restart)
        while True:
            data = os.read(self._requests, 4 * 65536)  # every waiting actor (GIL released)
            if self.wait_s > 0 and np.frombuffer(data, np.int32).min(initial=0) >= 0:
                data = self._gather(data)
            ids = np.frombuffer(data, np.int32)
            if ids.size and ids.min() < 0:
                return
            self._answer(np.unique(ids))

    def _gather(self, data: bytes) -> bytes:
        """``data`` (the records read) and more, arriving within ``wait_s`` of the first
        (``run.inference_wait_ms``), until every actor has an open request among them (a
        record can be stale: a restarted server answered its request already)."""
        deadline = time.perf_counter() + self.wait_s
        actors = len(self._replies)
        # (fewer records than actors: some actor is missing, no need to look closer)
        while len(data) // 4 < actors or self._open(data) < actors:
            left = deadline - time.perf_counter()
            if left <= 0 or not select.select([self._requests], [], [], left)[0]:
                break
            more = os.read(self._requests, 4 * 65536)
            data += more
            if np.frombuffer(more, np.int32).min(initial=0) < 0:  # _STOP: served next
                break
        return data

    def _open(self, data: bytes) -> int:
        """How many actors among the records ``data`` have an open request."""
        ids = np.unique(np.frombuffer(data, np.int32))
        control = self.arrays.control
        return int(np.count_nonzero(control[ids, REQUEST] != control[ids, ANSWERED]))

    def _answer(self, ids: np.ndarray) -> None:
        """One batched ``sample`` over the open requests of actors ``ids`` (sorted)."""
        control = self.arrays.control
        asked = control[ids, REQUEST]  # a snapshot: a request made after it waits its turn
        open_ = asked != control[ids, ANSWERED]
        ids, asked = ids[open_], asked[open_]
        if not ids.size:
            return
        self._load_weights()
        a = self.arrays
        rows = batch_rows(self.offsets, ids)
        obs = a.obs[rows]
        start = time.perf_counter()
        after: State = {}
        if self.policy is not None:
            state = {key: value[rows] for key, value in self.state.items()}
            if self.by_rows:
                state = self._reset_rows(ids, asked, rows, state)
            actions, extras, after = self.policy.act(obs, state, explore=True)
        elif self.by_rows:
            self._rows_ended(ids, asked, rows)
            actions, extras = self._hooks().sample_rows(obs, rows, len(a.ended))
        else:
            actions, extras = self._hooks().sample(obs)
        self._busy += time.perf_counter() - start
        a.actions[rows] = actions
        for name, value in extras.items():
            a.extras[name][rows] = value
        for key, value in after.items():  # last: a failed batch leaves the rows as they were
            self.state[key][rows] = value
        self._batches += 1  # (before the answers: an actor may read the stats at once)
        self._rows += len(obs)
        self._cpu_now = time.thread_time()
        control[ids, VERSION] = self.version
        control[ids, ANSWERED] = asked  # after the answers: the actor reads them after this
        for i in ids.tolist():
            with contextlib.suppress(BlockingIOError):  # a full FIFO: its reader has the news
                os.write(self._replies[i], b"\0")

    def _ended_rows(
        self, ids: np.ndarray, asked: np.ndarray, rows: slice | np.ndarray
    ) -> tuple[np.ndarray, Callable[[], None]]:
        """Which of the batch's rows (actors ``ids``, answering requests ``asked``) start
        over before they are acted for: those whose episodes ended, and every row of an
        actor answered for its first request (fresh envs); and what clears their flags."""
        a = self.arrays
        started = a.control[ids, STARTED]
        fresh = (started > self._started[ids]) & (asked >= started)
        flags = a.ended[rows] != 0
        if fresh.any():
            widths = self.offsets[ids + 1] - self.offsets[ids]
            flags |= np.repeat(fresh, widths)

        def clear() -> None:
            a.ended[rows] = 0
            self._started[ids[fresh]] = started[fresh]

        return flags, clear

    def _reset_rows(
        self, ids: np.ndarray, asked: np.ndarray, rows: slice | np.ndarray, state: State
    ) -> State:
        """The batch's ``state`` with the rows that start over reset by the policy (the
        flags cleared: the reset state is written back with the batch's next state)."""
        flags, clear = self._ended_rows(ids, asked, rows)
        if not flags.any():
            return state
        assert self.policy is not None
        state = self.policy.reset(state, flags, explore=True)
        for key, value in state.items():  # (before the flags go: a failed act loses nothing)
            self.state[key][rows] = value
        clear()
        return state

    def _rows_ended(self, ids: np.ndarray, asked: np.ndarray, rows: slice | np.ndarray) -> None:
        """An agent acting through ``sample_rows``: reset the rows that start over
        (:meth:`_ended_rows`) through its ``rows_ended``; clear the flags."""
        flags, clear = self._ended_rows(ids, asked, rows)
        if not flags.any():
            return
        index = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows
        self._hooks().rows_ended(index[flags], len(self.arrays.ended))
        clear()

    def _load_weights(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        version, weights, env_steps = pending
        if self.policy is not None:
            self.policy.load(weights, version)
        else:
            self._hooks().set_weights(weights)
        self.parts.env_steps = env_steps  # exploration schedules follow the learner's count
        self.version = version
        self._current = pending
