"""``@harness.remote``: run a class in another process (or host) behind a proxy.

Transport-neutral: this module knows nothing about ZeroMQ or Ray. A transport plugin's
``connect(address, **options)`` returns a :class:`Client`; the client creates actors and gives
back :class:`ActorHandle` objects; :class:`Proxy` turns attribute access into calls on a
handle::

    import harness

    @harness.remote(cpus=1)
    class Simulator:
        def __init__(self, seed): ...
        def step(self, action): ...

    with harness.connect():            # embedded local farm; or connect("tcp://host:port")
        sim = Simulator(seed=3)        # a proxy; the object lives in a worker process
        obs = sim.step(0)              # blocking call
        fut = sim.step.future(1)       # concurrent.futures.Future
        print(sim.seed)                # attribute read, also remote
        harness.release(sim)           # optional: ends the actor now (else at disconnect)

A remote exception is re-raised locally as :class:`RemoteError` with the remote type, message
and traceback; an actor whose process died raises :class:`ActorLost`.
"""

from __future__ import annotations

import inspect
import queue
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from harness.errors import ConfigError, HarnessError

__all__ = [
    "ActorHandle",
    "ActorLost",
    "ActorOptions",
    "Client",
    "Completions",
    "Proxy",
    "RemoteClass",
    "RemoteError",
    "SupportsCompletions",
    "SupportsRemoteInference",
    "SupportsReportMetrics",
    "completions",
    "connect",
    "current_client",
    "handle_of",
    "qualified_name",
    "release",
    "remote",
]

T = TypeVar("T")


class RemoteError(HarnessError):
    """An exception raised inside a remote actor, re-raised in the caller.

    ``remote_type`` is the qualified name of the remote exception class, ``remote_message``
    its message and ``remote_traceback`` the formatted remote traceback (also shown in
    ``str(error)``)."""

    def __init__(self, remote_type: str, remote_message: str, remote_traceback: str = "") -> None:
        self.remote_type = remote_type
        """The remote exception class's qualified name (see :func:`qualified_name`)."""
        self.remote_message = remote_message
        """The remote exception's message."""
        self.remote_traceback = remote_traceback
        """The formatted remote traceback (empty when the transport has none)."""
        text = f"{remote_type}: {remote_message}"
        if remote_traceback:
            text += "\n\nRemote traceback:\n" + remote_traceback.rstrip()
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.remote_type, self.remote_message, self.remote_traceback))

    def as_bad_input(self) -> HarnessError:
        """A :class:`~harness.errors.ConfigError` the actor raised (bad input it found, such
        as an env option its env checks only once stepped) as a local ``ConfigError`` with the
        same message and no remote traceback, which is how harness reports bad input; any
        other remote error as it is."""
        if self.remote_type == qualified_name(ConfigError):
            return ConfigError(self.remote_message)
        return self


def qualified_name(kind: type) -> str:
    """An exception class's name as :attr:`RemoteError.remote_type` gives it (``ValueError``,
    ``pkg.module.MyError``), the same in every transport."""
    module = getattr(kind, "__module__", "") or ""
    name = getattr(kind, "__qualname__", kind.__name__)
    return name if module in ("builtins", "__main__", "") else f"{module}.{name}"


class ActorLost(RemoteError):
    """The actor's process (or its host) died, or stopped answering heartbeats, before the
    call completed. Actor pools respawn the actor; a plain proxy is dead from then on."""

    def __init__(self, remote_type: str, remote_message: str, remote_traceback: str = "") -> None:
        super().__init__(remote_type, remote_message, remote_traceback)


@dataclass(frozen=True)
class ActorOptions:
    """Resources an actor asks for; the transport places it where they are free."""

    cpus: float = 1.0
    """CPU cores reserved for the actor (placement and the thread count it is given)."""
    gpus: int = 0
    """GPUs reserved for the actor (``CUDA_VISIBLE_DEVICES`` is set to them)."""
    memory_mb: int | None = None
    """Address-space limit of the actor process in MiB; exceeding it raises MemoryError
    inside the actor (or kills it), which the caller sees as RemoteError/ActorLost."""

    def __post_init__(self) -> None:
        if self.cpus < 0 or self.gpus < 0:
            raise ValueError(f"cpus and gpus must be >= 0, got cpus={self.cpus} gpus={self.gpus}")
        if self.memory_mb is not None and self.memory_mb <= 0:
            raise ValueError(f"memory_mb must be positive, got {self.memory_mb}")


class ActorHandle(Protocol):
    """One remote object, as a transport exposes it."""

    actor_id: str
    """Identifies the actor in messages and reprs (unique within its client)."""

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call ``method`` and wait for its result (raises RemoteError/ActorLost)."""
        ...

    def call_future(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Future[Any]:
        """Call ``method`` without waiting; calls on one actor run in the order sent."""
        ...

    def get_attribute(self, name: str) -> Any:
        """Read an attribute of the remote object."""
        ...

    def close(self) -> None:
        """End the actor (idempotent)."""
        ...


class Client(Protocol):
    """A connection to a farm of workers, returned by a transport's ``connect``.

    These two methods are what every transport must offer. A transport that can do more
    declares it by also having the methods of an optional capability, each a protocol of its
    own that callers check with ``isinstance`` before using it:

    * :class:`SupportsCompletions`: its own, cheaper :class:`Completions` (:func:`completions`
      falls back to the generic one);
    * :class:`SupportsReportMetrics`: somewhere to show a run's metrics (an actor farm reports
      there once per iteration; without it they go only to the run's trackers).
    """

    def create_actor(
        self,
        cls: type[Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: ActorOptions,
    ) -> ActorHandle:
        """Start an actor running ``cls(*args, **kwargs)`` and return its handle."""
        ...

    def close(self) -> None:
        """Release every actor this client created and disconnect (idempotent)."""
        ...


@runtime_checkable
class SupportsCompletions(Protocol):
    """An optional :class:`Client` capability: the transport hands back finished futures
    cheaper than done-callbacks and a queue can (the ZeroMQ client reads its actors' sockets
    in the calling thread). Check with ``isinstance(client, SupportsCompletions)``; or call
    :func:`completions`, which does."""

    def completions(self) -> Completions:
        """A new :class:`Completions` for futures of this client's actors (same contract as
        the generic one)."""
        ...


@runtime_checkable
class SupportsReportMetrics(Protocol):
    """An optional :class:`Client` capability: the transport shows a run's metrics beside
    the connection (the ZeroMQ cluster's ``harness cluster status`` and monitor page). Check
    with ``isinstance(client, SupportsReportMetrics)`` before calling."""

    def report_metrics(self, metrics: Mapping[str, Any]) -> None:
        """Replace the shown metrics (short names to numbers, e.g. ``steps_per_s``,
        ``policy_lag``, ``inbox``) with ``metrics``; called about once per iteration, so it
        must not block on the network."""
        ...


@runtime_checkable
class SupportsRemoteInference(Protocol):
    """An optional :class:`Client` capability: central inference (``run.inference =
    "central"``) for actors on other hosts. The farm's policy server exchanges observations
    and actions with local actors through shared memory (``link``: a
    ``harness.runtime.inference.InferenceLink`` of ``offsets``, ``extras``, ``by_rows`` and a
    directory on this host); the transport relays remote actors' requests into it. Check with
    ``isinstance(client, SupportsRemoteInference)``."""

    def serve_inference(self, link: Any) -> Any:
        """Start relaying for ``link``; returns an object with ``link`` (picklable, sent to
        the actors: its ``attach(index)`` gives actor ``index`` the stand-in for the agent
        that ``harness.runtime.inference.CentralActing`` is locally: ``begin_rollout``,
        ``sample``, ``episodes_ended``, ``oldest_version``, ``close``), ``stats()`` (metrics
        to log), ``check()`` (raises the error that stopped it for good, if one did) and
        ``close()``."""
        ...


# ------------------------------------------------------------------------------------------
# the current client: harness.connect() pushes one, leaving the with-block pops it

_clients: list[Client] = []
_clients_lock = threading.Lock()


def current_client() -> Client:
    """The innermost client opened with :func:`connect` (error if there is none)."""
    with _clients_lock:
        if _clients:
            return _clients[-1]
    raise HarnessError(
        "No harness connection: creating a remote object needs one. Wrap the code in "
        "'with harness.connect():' (an embedded local farm) or "
        "'with harness.connect(\"tcp://HOST:PORT\"):' (a cluster started with "
        "'harness cluster start')."
    )


class _Connection:
    """What :func:`connect` returns: the client, usable as a context manager."""

    def __init__(self, client: Client) -> None:
        self.client = client
        with _clients_lock:
            _clients.append(client)

    def __enter__(self) -> Client:
        return self.client

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with _clients_lock:
            if self.client in _clients:
                _clients.remove(self.client)
        self.client.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def connect(address: str | None = None, *, transport: str = "zmq", **options: Any) -> _Connection:
    """Connect to a farm and make it the current one for ``@remote`` classes.

    ``address=None`` starts an embedded local farm sized to this machine (no service to run
    first); otherwise ``address`` names a running cluster, e.g. ``"tcp://10.0.0.5:7450"``.
    ``transport`` picks the transport plugin; ``options`` go to its ``connect`` (for ZeroMQ:
    ``keys=`` the CURVE key directory, ``cpus=`` the embedded farm's size, ...).
    The result is a context manager; leaving it (or ``close()``) releases every actor."""
    from harness.plugins import collect_registry, make_plugin_manager

    registry = collect_registry(make_plugin_manager())
    spec = registry.transports.get(transport)
    return _Connection(spec.connect(address, **options))


# ------------------------------------------------------------------------------------------
# the decorator and the proxy


class RemoteClass(Generic[T]):
    """What ``@remote`` turns a class into: calling it creates a remote instance."""

    def __init__(self, cls: type[T], options: ActorOptions) -> None:
        self.cls = cls
        self.actor_options = options
        self.__doc__ = cls.__doc__
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__module__ = cls.__module__
        self.__wrapped__ = cls
        self._methods = frozenset(
            name
            for name, _ in inspect.getmembers(cls)
            if callable(inspect.getattr_static(cls, name, None))
            and not isinstance(inspect.getattr_static(cls, name, None), type)
        )

    def __call__(self, *args: Any, _client: Client | None = None, **kwargs: Any) -> Proxy:
        client = _client if _client is not None else current_client()
        handle = client.create_actor(self.cls, args, kwargs, self.actor_options)
        return Proxy(handle, self.cls, self._methods)

    def options(
        self,
        *,
        cpus: float | None = None,
        gpus: int | None = None,
        memory_mb: int | None = None,
    ) -> RemoteClass[T]:
        """The same class with other resource options (unset ones are kept)."""
        changes: dict[str, Any] = {}
        if cpus is not None:
            changes["cpus"] = cpus
        if gpus is not None:
            changes["gpus"] = gpus
        if memory_mb is not None:
            changes["memory_mb"] = memory_mb
        return RemoteClass(self.cls, replace(self.actor_options, **changes))

    def local(self, *args: Any, **kwargs: Any) -> T:
        """An ordinary in-process instance (for tests and serial runs)."""
        return self.cls(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<remote class {self.__module__}.{self.__qualname__}>"


def remote(
    cls: type[T] | None = None,
    *,
    cpus: float = 1.0,
    gpus: int = 0,
    memory_mb: int | None = None,
) -> Any:
    """Class decorator: instances run in a worker process of the current connection.

    Use bare (``@remote``) or with options (``@remote(cpus=2, memory_mb=4096)``)."""
    options = ActorOptions(cpus=cpus, gpus=gpus, memory_mb=memory_mb)

    def wrap(klass: type[T]) -> RemoteClass[T]:
        if not inspect.isclass(klass):
            raise TypeError(f"@remote decorates classes, got {klass!r}")
        return RemoteClass(klass, options)

    return wrap(cls) if cls is not None else wrap


class RemoteMethod:
    """``proxy.name``: call it to wait for the result, ``.future(...)`` not to."""

    __slots__ = ("_call", "_future", "name")

    def __init__(self, handle: ActorHandle, name: str) -> None:
        self.name = name
        self._call = handle.call
        self._future = handle.call_future

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(self.name, args, kwargs)

    def future(self, *args: Any, **kwargs: Any) -> Future[Any]:
        return self._future(self.name, args, kwargs)


class Proxy:
    """Stands in for a remote instance: methods become remote calls, other attribute reads
    are fetched from the actor. Module functions :func:`release` and :func:`handle_of` work on
    it (names on the proxy itself would shadow the remote class's own)."""

    __slots__ = ("__cls", "__dict__", "__handle", "__methods")

    def __init__(self, handle: ActorHandle, cls: type[Any], methods: frozenset[str]) -> None:
        object.__setattr__(self, "_Proxy__handle", handle)
        object.__setattr__(self, "_Proxy__cls", cls)
        object.__setattr__(self, "_Proxy__methods", methods)
        # every method is an instance attribute up front: ``proxy.step`` is then a plain
        # dictionary hit, not a failed lookup (an AttributeError built and discarded) followed
        # by __getattr__; names the proxy class itself defines keep to __getattr__
        self.__dict__.update(
            (name, RemoteMethod(handle, name))
            for name in methods
            if name not in _PROXY_NAMES and not (name.startswith("__") and name.endswith("__"))
        )

    def __getattr__(self, name: str) -> Any:
        if name in self.__methods:
            method = RemoteMethod(self.__handle, name)
            return method
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self.__handle.get_attribute(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"cannot set {name!r} on a remote {self.__cls.__name__}: add a method that sets it"
        )

    def __repr__(self) -> str:
        return f"<remote {self.__cls.__qualname__} actor {self.__handle.actor_id}>"

    def __reduce__(self) -> Any:
        raise TypeError("a remote proxy cannot be pickled or sent to another actor")


_PROXY_NAMES = frozenset(dir(Proxy))


def handle_of(proxy: Proxy) -> ActorHandle:
    """The transport handle behind a proxy."""
    if not isinstance(proxy, Proxy):
        raise TypeError(f"expected a remote proxy, got {type(proxy).__name__}")
    handle: ActorHandle = object.__getattribute__(proxy, "_Proxy__handle")
    return handle


def release(proxy: Proxy) -> None:
    """End the actor behind ``proxy`` now (it is also ended when its connection closes)."""
    handle_of(proxy).close()


class Completions:
    """Futures handed back as they finish, with a tag each: ``add(future, tag)`` while
    others are outstanding, ``next()`` returns the ``(future, tag)`` of one that is done.

    What an actor farm's learner needs to take rollouts in arrival order from hundreds of
    actors. This generic version uses done-callbacks and a queue; a transport can offer a
    cheaper one (see :func:`completions`). Futures of one actor are handed back in the order
    they were added when the actor answers in order (actors serve calls one at a time)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Future[Any], Any]] = queue.SimpleQueue()

    def add(self, future: Future[Any], tag: Any) -> None:
        """Watch ``future``; :meth:`next` hands it back with ``tag`` once it is done."""
        future.add_done_callback(lambda f: self._queue.put((f, tag)))

    def next(self, timeout: float | None = None) -> tuple[Future[Any], Any]:
        """The next finished ``(future, tag)``; ``TimeoutError`` after ``timeout`` seconds."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no future finished within {timeout} s") from None

    def close(self) -> None:
        """Stop watching (futures still outstanding are left alone)."""


def completions(client: Any = None) -> Completions:
    """A :class:`Completions` for futures of ``client`` (its transport's own when it has
    one, :class:`SupportsCompletions`: the ZeroMQ client's reads the actors' sockets in the
    calling thread through epoll, O(1) per finished call)."""
    if isinstance(client, _Connection):  # what connect() returned: ask the client inside
        client = client.client
    if isinstance(client, SupportsCompletions):
        return client.completions()
    return Completions()
