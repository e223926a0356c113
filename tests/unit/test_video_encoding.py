"""harness.video's encoding path with the real ffmpeg binary (imageio-ffmpeg's) and films read
back: the frames keep their content and orientation whether the renderer hands over
C-contiguous frames or transposed views (pygame's classic control), a narrow Atari-sized frame
keeps its size with a caption wrapped onto two lines, and harness.video_pipe's FfmpegPipe
keeps nothing of a frame once ``send`` returns (a renderer may reuse its buffer) even while
the pipe is full, and names ffmpeg's own message when it fails."""

from __future__ import annotations

import stat
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("imageio_ffmpeg")
pytest.importorskip("PIL")

from harness.errors import HarnessError
from harness.video import CAPTION_LINE_NARROW, EpisodeRecorder, contiguous
from harness.video_pipe import FfmpegPipe


class Frames:
    """A one-env vector env's render side: ``render()`` hands out the next frame."""

    def __init__(self, frames: list[np.ndarray]) -> None:
        self._frames = iter(frames)
        self.metadata = {"render_fps": 30}

    def render(self) -> tuple[np.ndarray]:
        return (next(self._frames),)


def scene(height: int, width: int, k: int) -> np.ndarray:
    """A frame with an orientation: dark left to bright right, a red band at the top, a
    white square that moves right by k pixels."""
    frame = np.zeros((height, width, 3), np.uint8)
    frame[:] = np.linspace(0, 200, width, dtype=np.uint8)[None, :, None]
    frame[: height // 8, :, 0] = 255
    frame[: height // 8, :, 1:] = 0
    y, x = height // 2, width // 4 + k
    frame[y : y + 16, x : x + 16] = 255
    return frame


def film(
    tmp_path: Path, frames: list[np.ndarray], name: str, **kwargs: Any
) -> tuple[np.ndarray, Any]:
    """Film ``frames`` as one episode (the last ends it) and read the MP4 back."""
    import imageio.v3 as iio

    recorder = EpisodeRecorder(tmp_path / name, episodes=1, env_id="test", **kwargs)
    envs = Frames(frames)
    recorder.start(envs)
    for _ in range(len(frames) - 2):
        recorder.after_step(envs, 1.0, False, {}, {})
    final = {"final_info": {"final_frame": [frames[-1]], "_final_frame": np.array([True])}}
    recorder.after_step(envs, 1.0, True, final, {"score": 0.5})
    files = recorder.close()
    assert files.mp4 is not None and files.frames == len(frames)
    return iio.imread(files.mp4), files


@pytest.mark.parametrize("transposed", [False, True])
def test_frames_keep_their_content_and_orientation(tmp_path: Path, transposed: bool) -> None:
    frames = [scene(120, 200, 4 * k) for k in range(12)]
    if transposed:  # pygame's layout: a transposed view of a (W, H, 3) array
        frames = [np.ascontiguousarray(f.transpose(1, 0, 2)).transpose(1, 0, 2) for f in frames]
        assert not frames[0].flags.c_contiguous
    decoded, _ = film(tmp_path, frames, f"t{int(transposed)}")
    assert len(decoded) == len(frames)
    for got, want in zip(decoded, frames, strict=True):
        error = np.abs(got[:120].astype(int) - want.astype(int)).mean()
        assert error < 6, error  # (H.264 at crf 23: a few levels)
    assert decoded[-1][100, 10:20].mean() < decoded[-1][100, 180:190].mean()  # dark left
    assert decoded[-1][5, 100, 0] > 200 and decoded[-1][5, 100, 1] < 60  # red top


def test_contiguous_copies_a_transposed_view_exactly() -> None:
    base = np.random.default_rng(0).integers(0, 256, (60, 40, 3), dtype=np.uint8)
    view = base.transpose(1, 0, 2)
    out = contiguous(view)
    assert out.flags.c_contiguous and out.shape == (40, 60, 3)
    assert np.array_equal(out, view)
    assert contiguous(out) is out  # (a C-contiguous frame goes as it is)
    flipped = base[::-1]
    assert np.array_equal(contiguous(flipped), flipped)


def test_a_narrow_frame_keeps_its_size_with_a_two_line_caption(tmp_path: Path) -> None:
    from PIL import Image

    frames = [scene(210, 160, k) for k in range(8)]  # ALE's 160x210
    decoded, files = film(tmp_path, frames, "atari")
    assert decoded.shape[1:] == (210 + 2 * CAPTION_LINE_NARROW, 160, 3)
    caption = decoded[0][210:].astype(int)
    rows = caption.max(axis=(1, 2))  # text on both lines: bright pixels in each half
    assert rows[:CAPTION_LINE_NARROW].max() > 150 and rows[CAPTION_LINE_NARROW:].max() > 150
    assert Image.open(files.gif).size[0] == 320  # the GIF enlarges it, pixels kept sharp


def shim(tmp_path: Path, body: str) -> str:
    """An executable standing in for ffmpeg (the real pipe, a consumer we control)."""
    path = tmp_path / "ffmpeg-shim"
    path.write_text(f"#!{sys.executable}\nimport sys, time, shutil\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_the_pipe_keeps_nothing_of_a_frame_once_send_returns(tmp_path: Path) -> None:
    """A consumer that starts reading late fills the pipe: the frames wait in the backlog,
    and the arrays handed to send() are overwritten at once (as a renderer reusing its
    buffer would); the file still holds what was sent."""
    exe = shim(
        tmp_path,
        "time.sleep(0.5)\nwith open(sys.argv[-1], 'wb') as f:\n"
        "    shutil.copyfileobj(sys.stdin.buffer, f)",
    )
    out = tmp_path / "raw.bin"
    pipe = FfmpegPipe(exe, out, (640, 480), 30.0, None, 1)
    rng = np.random.default_rng(1)
    sent = []
    buffer = np.empty((480, 640, 3), np.uint8)  # 900 KB a frame: the 1 MB pipe fills
    caption = np.empty((24, 640, 3), np.uint8)
    for _ in range(6):
        buffer[:] = rng.integers(0, 256, buffer.shape, dtype=np.uint8)
        caption[:] = rng.integers(0, 256, caption.shape, dtype=np.uint8)
        sent.append(buffer.tobytes() + caption.tobytes())
        pipe.send(buffer, caption)
        buffer[:] = 0  # (the renderer draws its next frame into the same array)
        caption[:] = 0
    pipe.close()
    assert out.read_bytes() == b"".join(sent)


def test_small_frames_are_gathered_and_all_written(tmp_path: Path) -> None:
    exe = shim(
        tmp_path,
        "with open(sys.argv[-1], 'wb') as f:\n    shutil.copyfileobj(sys.stdin.buffer, f)",
    )
    out = tmp_path / "raw.bin"
    pipe = FfmpegPipe(exe, out, (16, 16), 30.0, None, 1)
    frames = [np.full((16, 16, 3), i, np.uint8) for i in range(50)]  # 768 B each
    for frame in frames:
        pipe.send(frame)
    pipe.close()
    assert out.read_bytes() == b"".join(f.tobytes() for f in frames)


def test_an_ffmpeg_failure_names_its_message(tmp_path: Path) -> None:
    exe = shim(tmp_path, "sys.stderr.write('Unknown encoder libx999\\n')\nsys.exit(1)")
    pipe = FfmpegPipe(exe, tmp_path / "x.mp4", (640, 480), 30.0, None, 1)
    frame = np.zeros((480, 640, 3), np.uint8)
    with pytest.raises(HarnessError, match="Unknown encoder libx999"):
        for _ in range(20):  # (fails on a write into the closed pipe, or at close)
            pipe.send(frame)
        pipe.close()
