"""Validation of what peers send the master: header fields and msgpack payloads.

A wrong type or an out-of-range value is a :class:`~harness_zmq.wire.MalformedFrame` (the
master counts and drops the message), never an exception elsewhere. Nothing here unpickles.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from harness_zmq import wire
from harness_zmq.wire import MalformedFrame

__all__ = [
    "CLIENT_METRICS",
    "clean_gpus",
    "clean_metrics",
    "gpu_count",
    "id_field",
    "int_field",
    "memory_field",
    "number_field",
    "output_chunks",
    "payload_map",
    "plain_number",
    "reported_actor",
    "text_field",
]

CLIENT_METRICS = {"steps_per_s": 0.0, "policy_lag": 0.0, "inbox": 0, "dropped": 0}
"""The run metrics every client has in the status (zero until its heartbeats say more)."""


def text_field(h: dict[Any, Any], key: str, default: str | None = None, maxlen: int = 256) -> str:
    value = h.get(key, default)
    if not isinstance(value, str) or len(value) > maxlen:
        raise MalformedFrame(f"field {key!r} must be a string of at most {maxlen} characters")
    return value


def int_field(h: dict[Any, Any], key: str, default: int | None = None) -> int:
    value = h.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**62) < value < 2**62:
        raise MalformedFrame(f"field {key!r} must be an int")
    return value


def number_field(h: dict[Any, Any], key: str, default: float | None = None) -> float:
    value = h.get(key, default)
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 <= value <= 1e6
    ):
        raise MalformedFrame(f"field {key!r} must be a number in [0, 1e6]")
    return float(value)


def gpu_count(value: Any, key: str) -> int:
    """GPUs are sent as a count or as a list of device indices."""
    if isinstance(value, list) and len(value) <= 1024:
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1024:
        return value
    raise MalformedFrame(f"field {key!r} must be a GPU count or a list of indices")


def id_field(h: dict[Any, Any], key: str = "id") -> int | str:
    value = h.get(key)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise MalformedFrame(f"field {key!r} must be an int or a string")
    if isinstance(value, str) and len(value) > 128:
        raise MalformedFrame(f"field {key!r} is too long")
    if isinstance(value, int) and not -(2**62) < value < 2**62:
        raise MalformedFrame(f"field {key!r} is out of range")
    return value


def memory_field(h: dict[Any, Any], key: str = "memory_mb") -> int | None:
    value = h.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**40:
        raise MalformedFrame(f"field {key!r} must be a positive int or nil")
    return value


def payload_map(msg: wire.Message) -> dict[Any, Any]:
    """The optional msgpack map payload of hello/heartbeat ({} when absent)."""
    if not msg.payload:
        return {}
    data = wire.load_data(msg.payload)
    if not isinstance(data, dict):
        raise MalformedFrame(f"payload is a {type(data).__name__}, not a map")
    return data


def plain_number(value: Any, default: float = 0.0) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return default


def clean_gpus(value: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not isinstance(value, list):
        return out
    for item in value[:64]:
        if isinstance(item, dict):
            out.append(
                {
                    "index": int(plain_number(item.get("index"))),
                    "util": plain_number(item.get("util")),
                    "memory_used_mb": plain_number(item.get("memory_used_mb")),
                    "memory_total_mb": plain_number(item.get("memory_total_mb")),
                }
            )
    return out


def clean_metrics(value: dict[Any, Any]) -> dict[str, Any]:
    metrics: dict[str, Any] = dict(CLIENT_METRICS)
    for key, item in itertools.islice(value.items(), 64):
        if isinstance(key, str) and len(key) <= 64:
            if isinstance(item, int | float) and not isinstance(item, bool):
                metrics[key] = item if math.isfinite(item) else 0.0
            elif isinstance(item, str) and len(item) <= 256:
                metrics[key] = item
    return metrics


def reported_actor(a: Any) -> dict[str, Any]:
    """One entry of a worker hello's ``actors`` list, validated."""
    if not isinstance(a, dict):
        raise MalformedFrame("a reported actor must be a map")
    mb = a.get("memory_mb")
    if mb is not None and (not isinstance(mb, int) or isinstance(mb, bool) or mb <= 0):
        raise MalformedFrame("reported actor memory_mb must be a positive int or nil")
    return {
        "actor_id": text_field(a, "actor_id", maxlen=128),
        "client_id": text_field(a, "client_id", "", maxlen=128),
        "pid": int_field(a, "pid", 0),
        "endpoint": text_field(a, "endpoint", ""),
        "cpus": number_field(a, "cpus", 0.0),
        "gpus": gpu_count(a.get("gpus", 0), "gpus"),
        "memory_mb": mb,
        "client_host": text_field(a, "client_host", ""),
        "client_pid": int_field(a, "client_pid", 0),
    }


MAX_OUTPUT_CHUNKS = 4096
"""The most actors' output chunks one worker heartbeat may carry."""
MAX_OUTPUT_CHARS = 64 * 1024
"""The longest output chunk of one actor in one heartbeat (workers send at most 4 KiB)."""


def output_chunks(value: Any) -> list[tuple[str, int, int, str]]:
    """The ``logs`` of a worker heartbeat: ``[actor_id, start, end, text]`` items (byte
    offsets into the actor's output, ``start <= end``)."""
    if not isinstance(value, list) or len(value) > MAX_OUTPUT_CHUNKS:
        raise MalformedFrame(f"heartbeat 'logs' must be a list of at most {MAX_OUTPUT_CHUNKS}")
    out = []
    for item in value:
        if not isinstance(item, list) or len(item) != 4:
            raise MalformedFrame("a 'logs' item must be [actor_id, start, end, text]")
        actor_id, start, end, text = item
        if (
            not isinstance(actor_id, str)
            or not 0 < len(actor_id) <= 128
            or not isinstance(text, str)
            or len(text) > MAX_OUTPUT_CHARS
        ):
            raise MalformedFrame("a 'logs' item has the wrong types")
        for offset in (start, end):
            if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < 2**62:
                raise MalformedFrame("'logs' offsets must be ints >= 0")
        if start > end:
            raise MalformedFrame("a 'logs' item ends before it starts")
        out.append((actor_id, start, end, text))
    return out
