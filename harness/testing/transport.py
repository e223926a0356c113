"""check_transport: a transport against the remote-object contract of harness.remote."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from harness.registry import TransportSpec
from harness.testing.common import _check, _close, _fail, _owner


class ConformanceActor:
    """The class :func:`check_transport` runs remotely (importable wherever harness is)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def echo(self, x: Any) -> Any:
        return x

    def add(self, a: int, b: int = 0) -> int:
        return self.value + a + b

    def double(self, array: np.ndarray) -> np.ndarray:
        return array * 2

    def fail(self, message: str) -> None:
        raise ValueError(message)


def check_transport(spec: TransportSpec, address: Any = None, **options: Any) -> None:
    """Check a transport against the remote-object contract of :mod:`harness.remote`.

    ``spec.connect(address, **options)`` must return a :class:`harness.remote.Client`; the
    check creates a :class:`ConformanceActor` through it and verifies blocking calls, keyword
    arguments, futures, attribute reads, numpy arrays (dtype, shape, values; writable, or a
    read-only zero-copy view that refuses writes),
    ``RemoteError`` for a remote exception, that a released actor no longer answers, and that
    ``close()`` works twice. ``address``/``options`` are whatever your ``connect`` takes
    (``None`` asks for its local default). It starts real actors, so it takes seconds."""
    from harness.errors import HarnessError
    from harness.remote import ActorOptions, Proxy, RemoteClass, RemoteError, release

    who = f"transport {spec.name!r}{_owner(spec.plugin)}"
    _check(bool(spec.name), who, "TransportSpec.name is empty")
    _check(callable(spec.connect), who, f"TransportSpec.connect is {spec.connect!r}, not callable")
    try:
        signature = inspect.signature(spec.connect)
    except (TypeError, ValueError):  # some builtins have no signature: just call it
        signature = None
    if signature is not None:
        try:
            signature.bind(address, **options)
        except TypeError as exc:
            _fail(who, f"connect(address, **options) does not accept those arguments: {exc}")
    client = spec.connect(address, **options)
    for method in ("create_actor", "close"):
        _check(
            callable(getattr(client, method, None)),
            who,
            f"connect() returned {type(client).__name__} without {method}() "
            f"(see harness.remote.Client)",
        )
    try:
        cls = RemoteClass(ConformanceActor, ActorOptions(cpus=0.5))
        actor = cls(10, _client=client)
        _check(isinstance(actor, Proxy), who, "creating a remote instance gave no Proxy")
        _check(actor.echo("x") == "x", who, "echo('x') did not return 'x'")
        _check(actor.add(1, b=2) == 13, who, "add(1, b=2) on value 10 did not return 13")
        _check(actor.value == 10, who, "reading the attribute 'value' did not return 10")
        futures = [actor.add.future(i) for i in range(20)]
        _check(
            [f.result(timeout=60) for f in futures] == [10 + i for i in range(20)],
            who,
            "futures did not return the results of their calls in order",
        )
        array = np.arange(300_000, dtype=np.float32).reshape(1000, 300)
        doubled = actor.double(array)
        _check(isinstance(doubled, np.ndarray), who, "a numpy result came back as another type")
        _close(who, "double(array)", doubled, array * 2, rtol=0, atol=0)
        _check(doubled.dtype == np.float32, who, f"dtype changed to {doubled.dtype}")
        if not doubled.flags.writeable:  # a zero-copy view (Ray's object store): then
            try:  # writing must fail loudly, never change memory others read
                doubled[0, 0] = -1.0
            except ValueError:
                pass
            else:
                _fail(who, "a read-only array from a remote call accepted a write")
        try:
            actor.fail("expected by check_transport")
        except RemoteError as exc:
            _check("ValueError" in exc.remote_type, who, f"remote_type is {exc.remote_type!r}")
            _check(
                "expected by check_transport" in exc.remote_message,
                who,
                f"remote_message is {exc.remote_message!r}",
            )
            _check(bool(exc.remote_traceback), who, "RemoteError carries no remote traceback")
        else:
            _fail(who, "a remote ValueError was not re-raised as harness.RemoteError")
        release(actor)
        try:
            actor.echo(1)
        except HarnessError:
            pass
        else:
            _fail(who, "an actor still answered after harness.release()")
    finally:
        client.close()
    client.close()  # idempotent
