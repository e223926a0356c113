"""harness.safestate: nested payloads as arrays + JSON in one file, read without unpickling."""

from __future__ import annotations

import math
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.errors import CheckpointError
from harness.safestate import LegacyCheckpointError, is_state_file, load_state, save_state


def _roundtrip(tmp_path: Path, payload: Any, codec: Any = None) -> Any:
    path = tmp_path / "agent.x"
    save_state(path, payload, codec)
    assert path.exists() and not (tmp_path / "agent.x.npz").exists()
    return load_state(path, codec)


def test_edge_cases_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    rng.random(3)
    payload = {
        "optimizer": {
            "state": {0: {"step": np.float32(3.0)}, 1: {}},
            "param_groups": [{"params": [0, 1]}],
        },
        "rng": rng.bit_generator.state,  # 128-bit ints
        "tuple_key": {(1, "a"): None, None: True, 2.5: "x"},
        "floats": [math.nan, math.inf, -math.inf, 0.1, 1e300],
        "ints": [0, -1, 2**200, np.int64(-5), np.uint8(255)],
        "empty": [np.zeros((0, 3), np.float32), [], {}, ()],
        "strings": ["", "ünï", np.array(["a", "bc"])],
        "bytes": b"\x00\x80raw",
        "flag": False,
    }
    back = _roundtrip(tmp_path, payload)
    assert back["optimizer"]["state"][0]["step"] == np.float32(3.0)
    assert type(back["optimizer"]["state"][0]["step"]) is np.float32
    assert back["optimizer"]["param_groups"] == [{"params": [0, 1]}]
    assert back["rng"] == rng.bit_generator.state
    again = np.random.default_rng(0)
    again.bit_generator.state = back["rng"]
    assert again.random() == rng.random()
    assert back["tuple_key"] == {(1, "a"): None, None: True, 2.5: "x"}
    assert math.isnan(back["floats"][0]) and back["floats"][1:] == [math.inf, -math.inf, 0.1, 1e300]
    assert back["ints"] == [0, -1, 2**200, -5, 255] and type(back["ints"][4]) is np.uint8
    assert back["empty"][0].shape == (0, 3) and back["empty"][0].dtype == np.float32
    assert back["empty"][1:] == [[], {}, ()]
    assert back["strings"][:2] == ["", "ünï"] and list(back["strings"][2]) == ["a", "bc"]
    assert back["bytes"] == b"\x00\x80raw" and back["flag"] is False


class _Bf16Codec:
    """A codec like the backends': a fake 'bf16 tensor' stored as its uint16 view + a tag."""

    def encode(self, value: Any) -> tuple[np.ndarray, dict[str, Any]] | None:
        if isinstance(value, _Bf16):
            return value.bits, {"dtype": "bfloat16"}
        return None

    def decode(self, array: np.ndarray, info: Any) -> Any:
        assert info == {"dtype": "bfloat16"}
        return _Bf16(array)


class _Bf16:
    def __init__(self, bits: np.ndarray) -> None:
        self.bits = bits


def test_codec_values_keep_their_tag(tmp_path: Path) -> None:
    bits = np.array([0x3F80, 0xC000], np.uint16)  # 1.0 and -2.0 in bfloat16
    back = _roundtrip(tmp_path, {"w": _Bf16(bits)}, _Bf16Codec())
    assert isinstance(back["w"], _Bf16)
    np.testing.assert_array_equal(back["w"].bits, bits)


def test_unknown_type_is_refused_at_save_naming_the_key(tmp_path: Path) -> None:
    payload = {"algorithm": {"optimizer": {"param_groups": [{"foo": object()}]}}}
    with pytest.raises(
        CheckpointError, match=r"algorithm\.optimizer\.param_groups\[0\]\.foo: type"
    ):
        save_state(tmp_path / "f", payload)
    with pytest.raises(CheckpointError, match=r"a\[1\]: an array of dtype object"):
        save_state(tmp_path / "f", {"a": [1, np.array([None])]})
    assert not (tmp_path / "f").exists()


def _one_paragraph(exc: pytest.ExceptionInfo[CheckpointError], path: Path) -> str:
    text = str(exc.value)
    assert str(path) in text and "\n" not in text
    return text


def test_truncated_and_corrupt_files_are_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "agent.x"
    save_state(path, {"w": np.arange(1000.0), "n": 3})
    whole = path.read_bytes()
    for bad in (whole[: len(whole) // 2], whole[:10], b"", b"garbage" * 10):
        path.write_bytes(bad)
        with pytest.raises(CheckpointError) as exc:
            load_state(path)
        assert "corrupt or truncated" in _one_paragraph(exc, path)
        assert not is_state_file(path)
    # a well-formed zip whose skeleton is not JSON, or names a missing array
    for skeleton in (
        b"{not json",
        b'{"format": "harness-state", "version": 1, "tree": {"a": "a9"}}',
    ):
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("__harness_state__.npy", _npy(np.frombuffer(skeleton, np.uint8)))
        with pytest.raises(CheckpointError) as exc:
            load_state(path)
        _one_paragraph(exc, path)


def test_newer_format_versions_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.x"
    skeleton = b'{"format": "harness-state", "version": 99, "tree": null}'
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("__harness_state__.npy", _npy(np.frombuffer(skeleton, np.uint8)))
    with pytest.raises(CheckpointError, match="version 99"):
        load_state(path)


def _npy(array: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


class _Marker:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (str(self.path), "w"))


def test_pickles_are_refused_unread(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    plain = tmp_path / "agent.paddle"  # paddle.save: a bare pickle
    plain.write_bytes(pickle.dumps({"algorithm": _Marker(marker)}, protocol=4))
    zipped = tmp_path / "agent.torch"  # torch.save: a zip holding archive/data.pkl
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps(_Marker(marker)))
    npz = tmp_path / "agent.npz"  # an .npz with an object array (np.save pickles it)
    np.savez(npz, __harness_state__=np.array([_Marker(marker)], dtype=object))
    for path in (plain, zipped):
        with pytest.raises(LegacyCheckpointError) as exc:
            load_state(path)
        assert "harness checkpoint convert" in _one_paragraph(exc, path)
    with pytest.raises(CheckpointError) as refused:
        load_state(npz)
    _one_paragraph(refused, npz)
    assert not marker.exists()
