"""The zmq transport's envelope (``harness_zmq.wire``): headers, payloads with out-of-band
buffers, and what it does with malformed input."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import msgpack
import numpy as np
import pytest

from harness_zmq import wire
from harness_zmq.wire import PROTOCOL, Kind, MalformedFrame


def roundtrip(obj: Any) -> Any:
    frames = wire.dumps(obj)
    # what a receiver gets: separate buffers (bytes or writable frames), not our objects
    received = [bytes(frames[0]), *(bytearray(f) for f in frames[1:])]
    return wire.loads(received)


@pytest.mark.parametrize("kind", list(Kind))
def test_pack_unpack_every_kind(kind: Kind) -> None:
    frames = wire.pack(kind, {"id": 7, "name": "x"})
    msg = wire.unpack(frames)
    assert msg.kind is kind
    assert msg.header == {"v": PROTOCOL, "k": kind.value, "id": 7, "name": "x"}
    assert msg.payload == []


def test_pack_with_payload_and_header_only_decode() -> None:
    frames = wire.pack(Kind.CALL, {"id": 1, "m": "step"}, ((1, "a"), {"k": None}))
    msg = wire.unpack(frames)
    assert msg.kind is Kind.CALL and msg.header["m"] == "step"
    assert wire.loads(msg.payload) == ((1, "a"), {"k": None})
    assert wire.header(frames[0]) == msg.header
    # a None object means no payload at all
    assert len(wire.pack(Kind.RESULT, {"id": 1}, None)) == 1


def test_pack_data_is_msgpack_only() -> None:
    frames = wire.pack_data(Kind.STATUS_REPLY, {"id": 3}, {"workers": [1, 2], "x": 1.5})
    msg = wire.unpack(frames)
    assert wire.load_data(msg.payload) == {"workers": [1, 2], "x": 1.5}
    with pytest.raises(MalformedFrame):
        wire.load_data([])
    with pytest.raises(MalformedFrame):
        wire.load_data([b"\xc1"])  # 0xc1 is never valid msgpack


@pytest.mark.parametrize(
    "value",
    [
        0,
        -(2**70),
        1.5,
        "text",
        b"bytes" * 2000,
        None,
        (1, [2, {"a": 3}]),
        {"nested": {"list": [1.0, None]}},
    ],
)
def test_dumps_loads_values(value: Any) -> None:
    assert roundtrip(value) == value


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((262144,), np.float32),
        ((3, 4, 5), np.int64),
        ((), np.float64),
        ((0,), np.uint8),
        ((100, 100), np.bool_),
        ((64, 64), np.complex64),
    ],
)
def test_numpy_round_trip_out_of_band(shape: tuple[int, ...], dtype: Any) -> None:
    rng = np.random.default_rng(0)
    array = np.asarray(rng.random(shape) * 100).astype(dtype)
    frames = wire.dumps({"a": array})
    if array.nbytes >= wire.OOB_MIN_BYTES:
        # the array's memory is its own frame, not a copy inside the pickle stream
        assert len(frames) == 2
        assert np.shares_memory(np.frombuffer(frames[1], dtype=np.uint8), array)
        assert len(frames[0]) < 1000
    else:
        assert len(frames) == 1
    back = roundtrip({"a": array})["a"]
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    assert back.flags.writeable
    back[...] = 0  # writable buffers: no read-only surprise for the receiver


def test_non_contiguous_and_fortran_arrays() -> None:
    base = np.arange(200_000, dtype=np.float64).reshape(400, 500)
    for array in (base[::2, ::3], np.asfortranarray(base)):
        back = roundtrip(array)
        np.testing.assert_array_equal(back, array)
        assert back.flags.writeable


def test_loads_of_read_only_frames_gives_writable_arrays() -> None:
    array = np.arange(10_000, dtype=np.float32)
    frames = wire.dumps(array)
    received = [bytes(frames[0]), bytes(frames[1])]  # bytes are read-only buffers
    back = wire.loads(received)
    assert back.flags.writeable
    np.testing.assert_array_equal(back, array)


def test_big_in_band_stream_and_reuse() -> None:
    big = [b"x" * 100_000, list(range(50_000))]
    for _ in range(3):  # the per-thread pickler and stream are reused safely
        assert roundtrip(big) == big
        assert roundtrip(1) == 1


def test_dynamic_class_travels_by_value() -> None:
    namespace: dict[str, Any] = {}
    exec("class Made:\n    def f(self):\n        return 41 + 1\n", namespace)
    made = namespace["Made"]
    made.__module__ = "__main__"
    made.__qualname__ = "Made"
    back = roundtrip(made)
    assert back().f() == 42


class _Reentrant:
    """Its pickling calls wire.dumps again (the per-thread pickler is busy then)."""

    def __reduce__(self) -> Any:
        inner = wire.dumps({"inner": np.ones(5000)})
        return (_rebuild, ([bytes(f) for f in inner],))


def _rebuild(frames: list[bytes]) -> Any:
    return wire.loads(frames)


def test_dumps_is_reentrant() -> None:
    back = roundtrip([_Reentrant(), 5])
    assert back[1] == 5
    np.testing.assert_array_equal(back[0]["inner"], np.ones(5000))


def test_dumps_failure_leaves_a_clean_pickler() -> None:
    with pytest.raises(Exception):  # noqa: B017 - which pickling error does not matter
        wire.dumps([1, threading.Lock()])
    assert roundtrip([1, 2]) == [1, 2]


def test_dumps_from_many_threads() -> None:
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(200):
                value = {"i": i, "j": j, "a": np.full(2000, i, dtype=np.int32)}
                back = roundtrip(value)
                assert back["i"] == i and back["j"] == j and int(back["a"][0]) == i
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b""],
        [b"\xc1garbage"],
        [msgpack.packb([1, 2, 3])],
        [msgpack.packb("a string")],
        [msgpack.packb({"k": "call"})],
        [msgpack.packb({"v": "1", "k": "call"})],
        [msgpack.packb({"v": 1.0, "k": "call"})],
        [msgpack.packb({"v": True, "k": "call"})],
        [msgpack.packb({"v": PROTOCOL, "k": 5})],
        [msgpack.packb({"v": PROTOCOL, "k": "no-such-kind"})],
        [msgpack.packb({"v": PROTOCOL})],
    ],
)
def test_malformed_headers_raise(frames: list[bytes]) -> None:
    with pytest.raises(MalformedFrame):
        wire.unpack(frames)


def test_other_version_is_decoded_for_refusal() -> None:
    msg = wire.unpack([msgpack.packb({"v": PROTOCOL + 1, "k": "call", "id": 1})])
    assert msg.header["v"] == PROTOCOL + 1
    assert msg.kind is Kind.REFUSED  # not trusted beyond its version
    hello = wire.unpack([msgpack.packb({"v": PROTOCOL + 1, "k": "hello"})])
    assert hello.kind is Kind.HELLO


@pytest.mark.parametrize("payload", [[], [b"not a pickle"], [b"\x80\x05garbage"]])
def test_malformed_payload_raises(payload: list[bytes]) -> None:
    with pytest.raises(MalformedFrame):
        wire.loads(payload)


def test_unpickling_errors_keep_their_cause() -> None:
    stream = pickle.dumps(1, 5).replace(b"K\x01", b"c__no_such_module__\nx\n")
    with pytest.raises(MalformedFrame) as info:
        wire.loads([stream])
    assert info.value.__cause__ is not None


def test_inline_payload_rides_in_the_header() -> None:
    """A small payload travels as the header's bin field "p" (one frame); unpack and payload()
    give the same payload frames either way, and a "p" that is not bytes is malformed."""
    body = wire.dumps({"x": 1, "y": [1, 2, 3]})
    assert len(body) == 1 and len(body[0]) <= wire.INLINE_MAX
    one = msgpack.packb({"v": PROTOCOL, "k": "result", "id": 7, "p": bytes(body[0])})
    msg = wire.unpack([one])
    assert msg.kind is Kind.RESULT and "p" not in msg.header and msg.header["id"] == 7
    assert wire.loads(msg.payload) == {"x": 1, "y": [1, 2, 3]}
    head = wire.header(one)
    assert wire.loads(wire.payload(head, [one])) == {"x": 1, "y": [1, 2, 3]}
    two = wire.pack(Kind.RESULT, {"id": 7}, {"x": 1, "y": [1, 2, 3]})
    assert len(two) == 2 and wire.payload(wire.header(two[0]), two) == two[1:]
    assert wire.payload(wire.header(two[0]), two[:1]) == []
    bad = msgpack.packb({"v": PROTOCOL, "k": "result", "id": 7, "p": "text"})
    with pytest.raises(MalformedFrame, match="'p' is a str"):
        wire.unpack([bad])


def test_plain_values_take_the_c_pickler_and_round_trip() -> None:
    """wire.plain: what the C pickler pickles exactly as cloudpickle would, containers of
    plain values included; anything else goes through cloudpickle."""
    import collections

    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    plain_values = [
        1, 2.5, None, "s", b"b", True, arr,
        {"obs": arr, "episodes": [(200.0, 200)], "extras": {}, "n": 3},
        [arr, (1, "a"), {"k": [None]}],
        {i: i for i in range(wire.PLAIN_MAX_ITEMS)},
    ]  # fmt: skip
    point = collections.namedtuple("point", "x y")
    not_plain = [
        lambda x: x,
        np.array([object()], dtype=object),
        {"f": print},
        [[[[1]]]],  # deeper than 3 levels
        list(range(wire.PLAIN_MAX_ITEMS + 1)),
        collections.OrderedDict(a=1),
        point(1, 2),
        {(1, 2): 3},  # a key that is not a plain scalar
        {1, 2},
    ]
    for value in plain_values:
        assert wire.plain(value), value
        back = wire.loads(wire.dumps(value))
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(back, value)
        elif isinstance(value, dict) and "obs" in value:
            np.testing.assert_array_equal(back["obs"], arr)
            assert back["episodes"] == [(200.0, 200)] and back["extras"] == {} and back["n"] == 3
        elif isinstance(value, list) and isinstance(value[0], np.ndarray):
            assert back[1:] == value[1:]
        else:
            assert back == value and type(back) is type(value)
    for value in not_plain:
        assert not wire.plain(value), value
    assert wire.loads(wire.dumps(point(1, 2))) == (1, 2)
    big = np.zeros(100_000, np.float64)  # out of band as its own frame on either path
    assert len(wire.dumps({"w": big, "v": 1})) == 2
