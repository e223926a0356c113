"""The Ray transport: :mod:`harness.remote`'s client protocol on Ray actors.

Each ``@harness.remote`` instance is one Ray actor, an :class:`_ActorHost` subclass made per
remote class with one Ray method ``m_NAME`` per method of the class; it builds the object in
its own worker process. A call's arguments are Ray's own arguments, and its future is fetched
with ``ray.get`` unless something watches it (:class:`RayFuture`). What maps to what:

* resources: ``ActorOptions.cpus``/``gpus`` -> Ray's ``num_cpus``/``num_gpus`` (Ray sets the
  actor's ``OMP_NUM_THREADS`` and ``CUDA_VISIBLE_DEVICES`` from them), ``memory_mb`` -> Ray's
  ``memory`` resource (placement; Ray's memory monitor, not an rlimit, guards it);
* futures -> Ray object refs, completed into ``concurrent.futures.Future``s;
* a remote exception -> the same :class:`~harness.remote.RemoteError` (type, message, remote
  traceback) as the ZeroMQ transport; a dead actor (killed, crashed, its node gone) ->
  :class:`~harness.remote.ActorLost`, so an actor pool respawns it the same way. Actors are
  created with ``max_restarts=0``: replacing one is the pool's decision, not Ray's.
* data: results come back through Ray's object store; large numpy arrays are zero-copy views of
  it (read-only). An argument that repeats across calls (a farm's weights, sent with every
  rollout request of a version) is ``ray.put`` once and passed by reference: one copy in the
  object store per version, however many actors read it.

Security: a local Ray that this transport starts (no address, no ``RAY_ADDRESS``, ray not yet
imported in the process) runs in Ray's single-machine mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
=0``): the node address is 127.0.0.1 and every Ray server binds loopback only. On top, Ray
(>= 2.52) turns on token authentication for every cluster it starts: a peer without the
cluster's token (``~/.ray/auth_token``, readable by its user only) is refused before anything
it sends is deserialised, and :func:`connect` refuses to start a local Ray with authentication
turned off (``RAY_AUTH_MODE=disabled``). A Ray this process had already initialised, or a
remote cluster, is as trusted as its own settings (token auth, TLS) make it: harness adds no
layer of its own.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import socket
import threading
import traceback
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np
import ray
from ray import exceptions as rex

from harness.cpus import cpu_share
from harness.errors import ConfigError, HarnessError
from harness.remote import ActorLost, ActorOptions, RemoteError, qualified_name

log = logging.getLogger(__name__)

PUT_MIN_BYTES = 64 * 1024
"""Arguments with at least this many bytes of numpy data are put into the object store once
and passed by reference (a repeated one reuses its reference)."""
PUT_CACHE = 4
"""How many put arguments are remembered (a farm needs the current and the previous version)."""
_MAX_TEXT = 4000

_ray_lock = threading.Lock()
_owned_clients = 0
"""Open clients of a Ray this module started; the last one to close shuts it down."""
_owner_stop: threading.Event | None = None
"""Ends the thread that started the local Ray (see :func:`_init_local`)."""


# ------------------------------------------------------------------------------------------
# the actor side


def _as_remote_error(exc: BaseException) -> RemoteError:
    """``exc`` as the transport-neutral error (picklable whatever ``exc`` holds)."""
    if isinstance(exc, RemoteError):
        return exc
    try:
        message = str(exc)[:_MAX_TEXT]
    except BaseException as inner:  # a user exception's __str__ may raise
        message = f"<unprintable: {type(inner).__name__}>"
    text = "".join(traceback.format_exception(exc))[-5 * _MAX_TEXT :]
    return RemoteError(qualified_name(type(exc)), message, text)


class _ActorHost:
    """The Ray actor behind one remote object. :func:`_host_class` subclasses it per remote
    class with one Ray method ``m_NAME`` per method of the class, so a call's arguments travel
    as Ray's own (one serialised value each, put references resolved by Ray) and no method
    name goes with them; ``call`` serves any other name."""

    def __init__(self, cls: type[Any], /, *args: Any, **kwargs: Any) -> None:
        self._error: RemoteError | None = None
        self.obj: Any = None
        try:
            self.obj = cls(*args, **kwargs)
        except Exception as exc:  # reported by ready(), so creating it fails like a call
            self._error = _as_remote_error(exc)

    def ready(self) -> int:
        if self._error is not None:
            raise self._error
        return os.getpid()

    def call(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.obj, method)(*args, **kwargs)
        except Exception as exc:
            raise _as_remote_error(exc) from None

    def get_attribute(self, name: str) -> Any:
        try:
            return getattr(self.obj, name)
        except Exception as exc:
            raise _as_remote_error(exc) from None


def _host_method(name: str) -> Any:
    def method(self: _ActorHost, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.obj, name)(*args, **kwargs)
        except Exception as exc:
            raise _as_remote_error(exc) from None

    method.__name__ = method.__qualname__ = f"m_{name}"
    return method


def remote_methods(cls: type[Any]) -> list[str]:
    """The methods of ``cls`` that get a Ray method of their own (dunders go through
    ``call``)."""
    return sorted(
        name
        for name, _ in inspect.getmembers(cls)
        if not (name.startswith("__") and name.endswith("__"))
        and callable(inspect.getattr_static(cls, name, None))
        and not isinstance(inspect.getattr_static(cls, name, None), type)
    )


_hosts: dict[type[Any], tuple[Any, frozenset[str]]] = {}
"""Per remote class: its Ray actor class and the names that have an ``m_NAME`` method."""


def _host_class(cls: type[Any]) -> tuple[Any, frozenset[str]]:
    with _ray_lock:
        made = _hosts.get(cls)
        if made is None:
            names = remote_methods(cls)
            host = type(
                f"RayHost_{cls.__name__}",
                (_ActorHost,),
                {f"m_{name}": _host_method(name) for name in names},
            )
            made = _hosts[cls] = (ray.remote(host), frozenset(names))
        return made


# ------------------------------------------------------------------------------------------
# the caller side


def translate(exc: BaseException, actor_id: str) -> BaseException:
    """A Ray error as harness's: RemoteError for an exception raised by the actor's code,
    ActorLost for an actor that is gone; anything else unchanged."""
    if isinstance(exc, rex.RayTaskError):
        cause = exc.cause
        if isinstance(cause, RemoteError):
            return cause
        if cause is not None:
            return RemoteError(qualified_name(type(cause)), str(cause), exc.traceback_str)
        return RemoteError("RayTaskError", str(exc), getattr(exc, "traceback_str", ""))
    lost = (rex.RayActorError, rex.WorkerCrashedError, rex.ObjectLostError, rex.OwnerDiedError)
    if isinstance(exc, lost):
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        return ActorLost(type(exc).__name__, f"Ray actor {actor_id} is gone: {first}")
    return exc


def _numpy_bytes(value: Any, depth: int = 0) -> int:
    """Bytes of numpy data in ``value`` (arrays, and containers of them two levels deep)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if depth < 3 and isinstance(value, tuple | list):
        return sum(_numpy_bytes(v, depth + 1) for v in value)
    if depth < 3 and isinstance(value, dict):
        return sum(_numpy_bytes(v, depth + 1) for v in value.values())
    return 0


class RayFuture(Future[Any]):
    """A call's result: the object ref, fetched with ``ray.get`` by ``result()`` /
    ``exception()`` in the caller's thread. Ray's completion callback (which Ray runs on its
    own thread, taking the GIL from the caller once per call) is armed only when something
    watches the future without asking for its result: ``add_done_callback`` (the farm's
    stream, :class:`harness.remote.Completions`), ``done()``, ``concurrent.futures.wait`` or
    ``as_completed`` (through the waiters list they register on)."""

    def __init__(self, ref: Any, actor_id: str) -> None:
        self._ref = ref
        self._actor_id = actor_id
        self._armed = False
        super().__init__()

    # concurrent.futures.wait / as_completed register through this list under the future's
    # condition; reading it arms the callback so they are woken
    @property
    def _waiters(self) -> list[Any]:
        self._arm()
        waiters: list[Any] = self.__dict__["_waiters_list"]
        return waiters

    @_waiters.setter
    def _waiters(self, value: list[Any]) -> None:
        self.__dict__["_waiters_list"] = value

    def _arm(self) -> None:
        if self._armed or self._ref is None:
            return
        self._armed = True
        self._ref.future().add_done_callback(self._completed)

    def _completed(self, ray_future: Future[Any]) -> None:
        try:
            result = ray_future.result()
        except BaseException as exc:
            self._settle(exc, None)
        else:
            self._settle(None, result)

    def _settle(self, exc: BaseException | None, result: Any) -> None:
        self._ref = None  # the object store copy is freed once nothing refers to it
        with contextlib.suppress(InvalidStateError):  # the callback and a ray.get both ended
            if exc is not None:
                self.set_exception(translate(exc, self._actor_id))
            else:
                self.set_result(result)

    def _fetch(self, timeout: float | None) -> None:
        ref = self._ref
        if ref is None or self._armed or Future.done(self):
            return
        try:
            result = ray.get(ref, timeout=timeout)
        except rex.GetTimeoutError:
            raise FutureTimeout() from None
        except rex.RayError as exc:
            self._settle(exc, None)
        else:
            self._settle(None, result)

    def add_done_callback(self, fn: Any) -> None:
        self._arm()
        super().add_done_callback(fn)

    def done(self) -> bool:
        self._arm()
        return super().done()

    def result(self, timeout: float | None = None) -> Any:
        self._fetch(timeout)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._fetch(timeout)
        return super().exception(timeout)


class RayActorHandle:
    """One remote object on Ray (see :class:`harness.remote.ActorHandle`)."""

    def __init__(self, client: RayClient, actor: Any, methods: frozenset[str]) -> None:
        self._client = client
        self._actor = actor
        self._methods = {name: getattr(actor, f"m_{name}") for name in methods}
        self.actor_id = actor._actor_id.hex()[:12]
        self._closed = False

    def _submit(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._closed:
            raise ActorLost("Released", f"Ray actor {self.actor_id} was released")
        share = self._client.share
        ray_method = self._methods.get(method)
        if ray_method is not None:
            return ray_method.remote(*[share(a) for a in args], **kwargs)
        return self._actor.call.remote(method, *[share(a) for a in args], **kwargs)

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ref = self._submit(method, args, kwargs)
        try:
            return ray.get(ref)
        except rex.RayError as exc:
            raise translate(exc, self.actor_id) from None

    def call_future(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Future[Any]:
        try:
            ref = self._submit(method, args, kwargs)
        except BaseException as exc:
            out: Future[Any] = Future()
            out.set_exception(exc)
            return out
        return RayFuture(ref, self.actor_id)

    def get_attribute(self, name: str) -> Any:
        try:
            return ray.get(self._actor.get_attribute.remote(name))
        except rex.RayError as exc:
            raise translate(exc, self.actor_id) from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._client._forget(self)
        with contextlib.suppress(Exception):
            ray.kill(self._actor, no_restart=True)


class RayClient:
    """Actors on the Ray this process is connected to (see :class:`harness.remote.Client`).

    It has neither optional client capability: :func:`harness.remote.completions` gives the
    generic :class:`~harness.remote.Completions` (whose done-callbacks arm :class:`RayFuture`'s
    completion callback), and a farm's run metrics go only to the run's trackers (Ray's own
    dashboard shows its actors)."""

    def __init__(self, address: str, owns_ray: bool, start_timeout_s: float) -> None:
        self.address = address
        self._owns_ray = owns_ray
        self._start_timeout_s = start_timeout_s
        self._handles: dict[int, RayActorHandle] = {}
        self._puts: OrderedDict[int, tuple[Any, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    def share(self, value: Any) -> Any:
        """``value``, or an object ref to one copy of it in the object store when it carries
        at least PUT_MIN_BYTES of numpy data; the same object again gets the same ref."""
        if _numpy_bytes(value) < PUT_MIN_BYTES:
            return value
        key = id(value)
        with self._lock:
            cached = self._puts.get(key)
            if cached is not None and cached[0] is value:
                self._puts.move_to_end(key)
                return cached[1]
        ref = ray.put(value)
        with self._lock:  # the entry keeps ``value`` alive, so its id is not reused meanwhile
            self._puts[key] = (value, ref)
            while len(self._puts) > PUT_CACHE:
                self._puts.popitem(last=False)
        return ref

    def create_actor(
        self,
        cls: type[Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: ActorOptions,
    ) -> RayActorHandle:
        if self._closed:
            raise HarnessError("this Ray connection is closed")
        ray_options: dict[str, Any] = {
            "num_cpus": options.cpus,
            "num_gpus": options.gpus,
            "max_restarts": 0,
            "max_task_retries": 0,
        }
        if options.memory_mb:
            ray_options["memory"] = options.memory_mb * 2**20
        host, methods = _host_class(cls)
        shared = [self.share(a) for a in args]
        actor = host.options(**ray_options).remote(cls, *shared, **kwargs)
        handle = RayActorHandle(self, actor, methods)
        try:
            ray.get(actor.ready.remote(), timeout=self._start_timeout_s)
        except rex.GetTimeoutError:
            handle.close()
            raise ActorLost(
                "NotPlaced",
                f"Ray did not start a {cls.__qualname__} actor within {self._start_timeout_s:g} s "
                f"(it asked for {options.cpus:g} CPUs, {options.gpus} GPUs): the cluster at "
                f"{self.address} may have no free resources of that size.",
            ) from None
        except rex.RayError as exc:
            handle.close()
            raise translate(exc, handle.actor_id) from None
        with self._lock:
            self._handles[id(handle)] = handle
        return handle

    def _forget(self, handle: RayActorHandle) -> None:
        with self._lock:
            self._handles.pop(id(handle), None)

    def close(self) -> None:
        global _owned_clients, _owner_stop
        if self._closed:
            return
        self._closed = True
        with self._lock:
            handles = list(self._handles.values())
            self._puts.clear()
        for handle in handles:
            handle.close()
        if self._owns_ray:
            with _ray_lock:
                _owned_clients -= 1
                if _owned_clients == 0:
                    if ray.is_initialized():
                        ray.shutdown()
                    if _owner_stop is not None:
                        _owner_stop.set()
                        _owner_stop = None

    def __enter__(self) -> RayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _init_local(**init: Any) -> None:
    """``ray.init(**init)`` for a local Ray, from a thread that lives until Ray is shut down.

    Ray starts its daemons (GCS, raylet) with ``PR_SET_PDEATHSIG``, which the kernel fires
    when the *thread* that started them ends, not the process: a local Ray started from a
    short-lived thread (a thread pool's, or ``harness tune``'s starter thread) lost its GCS the
    moment that thread returned, and a minute later Ray terminated the whole process. The main
    thread lives as long as the process, so it calls ``ray.init`` itself."""
    global _owner_stop
    if threading.current_thread() is threading.main_thread():
        ray.init(**init)
        return
    started: Future[None] = Future()
    stop = threading.Event()

    def own() -> None:
        try:
            ray.init(**init)
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result(None)
        stop.wait()

    threading.Thread(target=own, name="harness-ray-owner", daemon=True).start()
    started.result()
    _owner_stop = stop


def _check_reachable(address: str, timeout_s: float) -> None:
    """Fail in seconds, naming the address, when nothing listens there (ray.init would retry
    for a minute or more)."""
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"Ray address {address!r} is not HOST:PORT, ray://HOST:PORT or 'auto' (set it with "
            f"--set run.cluster=... or RAY_ADDRESS)."
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise HarnessError(
            f"Cannot reach the Ray cluster at {address!r} within {timeout_s:g} s ({exc}). Is "
            f"it running (`ray start --head` prints its address)? Check run.cluster / "
            f"RAY_ADDRESS, or leave both empty for a local Ray."
        ) from None


def connect(
    address: str | None = None,
    *,
    cpus: float | None = None,
    preload: Sequence[str] = (),
    actor_nice: int = 0,
    keys: Any = None,
    connect_timeout_s: float = 5.0,
    start_timeout_s: float = 300.0,
    log_to_driver: bool = False,
) -> RayClient:
    """A client of the Ray cluster at ``address`` (``HOST:PORT``, ``ray://HOST:PORT``,
    ``auto``), else of ``RAY_ADDRESS``, else of a local Ray started here (token-authenticated) with
    ``cpus`` CPUs (default: this process's share of the machine) and stopped when the last
    client that needed it closes. A Ray this process already initialised is used as it is.

    ``connect_timeout_s``: how long an address may take to answer a TCP connect.
    ``start_timeout_s``: how long an actor may take to be placed and constructed.
    ``log_to_driver``: forward the actors' stdout/stderr here (Ray's option).
    ``preload`` and ``actor_nice`` (ZeroMQ local-farm options) do not apply: Ray starts and
    schedules its own worker processes."""
    global _owned_clients
    if keys:
        raise ConfigError(
            "run.cluster_keys (CURVE keys) belongs to the ZeroMQ transport; a Ray cluster "
            "authenticates with Ray's own token / TLS settings. Unset cluster_keys, or use "
            "transport = 'zmq'."
        )
    del preload, actor_nice
    target = address or os.environ.get("RAY_ADDRESS") or None
    with _ray_lock:
        if ray.is_initialized():
            owns = False
            where = target or "the Ray already initialised in this process"
        elif target is None:
            if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
                raise ConfigError(
                    "RAY_AUTH_MODE=disabled: a local Ray listens on this host's network "
                    "address, and without its token authentication any peer could send it "
                    "pickled objects. Unset RAY_AUTH_MODE (or use transport = 'zmq', which "
                    "binds loopback)."
                )
            _init_local(
                num_cpus=int(cpus) if cpus else cpu_share(),
                include_dashboard=False,
                log_to_driver=log_to_driver,
            )
            owns, where = True, "a local Ray"
        else:
            if target != "auto":
                _check_reachable(target, connect_timeout_s)
            try:
                ray.init(address=target, log_to_driver=log_to_driver)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise HarnessError(
                    f"Could not connect to the Ray cluster at {target!r}: {exc}"
                ) from None
            owns, where = True, target
        if owns:
            _owned_clients += 1
    log.info("ray %s: actors on %s", ray.__version__, where)
    return RayClient(where, owns, start_timeout_s)
