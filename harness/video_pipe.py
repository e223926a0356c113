"""Writing raw frames into an ffmpeg process that encodes them as an H.264 MP4 (for
:mod:`harness.video`): the pipe, its backlog and ffmpeg's options. Only numpy and the
standard library; the ffmpeg binary comes from the caller (imageio-ffmpeg's)."""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import select
import subprocess
import tempfile
from pathlib import Path
from typing import NoReturn

import numpy as np

from harness.errors import HarnessError

X264_PRESET = "superfast"
"""x264's preset. The encoder runs in its own process beside the evaluation and only has to
keep up with it; at 160x234 (a Pong frame and its caption) ``superfast`` takes about 0.42 ms
a frame of one core of the dev VM, at 600x424 (CartPole) about 2.1 ms, of which 1 ms is
ffmpeg's conversion of RGB into yuv420p (``ultrafast``: 1.6 ms, and files half as large
again)."""

PIPE_BYTES = 1 << 20
"""The size asked for ffmpeg's input pipe (Linux's limit for an unprivileged process; the
default 64 KiB holds less than one frame, and each frame then cost a wait for ffmpeg)."""

CHUNK_BYTES = 256 << 10
"""Frames smaller than this are gathered and written in chunks of at least this size: ffmpeg
then wakes once for several frames (Pong's 120 KB frames: its CPU 0.79 -> 0.67 ms a
frame, and fewer of its threads' wake-ups landing on the evaluation's core)."""

BACKLOG_BYTES = 16 << 20
"""Frame bytes kept in memory when ffmpeg's pipe is full, at most; past it the evaluation
waits for ffmpeg (bounded memory: 19 CartPole frames, 140 of Pong)."""


def encoder_threads() -> int:
    """x264 threads: the cores this process may use less the one the evaluation steps on
    (at least 1, at most 4). On 2 cores ffmpeg gets one: more threads only took the
    evaluation's core."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        cores = os.cpu_count() or 1
    return max(1, min(4, cores - 1))


class FfmpegPipe:
    """An ffmpeg process encoding raw rgb24 frames written into its stdin as an H.264 MP4.

    :meth:`send` writes a frame's rows from the evaluation's thread without blocking: the
    pipe is enlarged to :data:`PIPE_BYTES`, and what it cannot take at once waits in a
    backlog (copied, since a renderer or a caption may reuse its buffer) that the next
    frames push on; the evaluation waits only when the backlog passes :data:`BACKLOG_BYTES`,
    i.e. when ffmpeg cannot keep up. (A thread feeding imageio-ffmpeg's writer, the first
    design, cost ~0.5 ms of CPU a frame in thread switches and pipe waits: more than a Pong
    frame's encoding.) ``filters``: ffmpeg's ``-vf`` (a scale, a pad), or None. ffmpeg's
    messages go to a temporary file and are quoted when it fails."""

    def __init__(
        self,
        exe: str,
        path: Path,
        size: tuple[int, int],
        fps: float,
        filters: str | None,
        threads: int,
    ) -> None:
        self.path = path
        cmd = [exe, "-hide_banner", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24"]
        cmd += ["-s", f"{size[0]}x{size[1]}", "-r", f"{fps:g}", "-i", "-", "-an"]
        if filters:
            cmd += ["-vf", filters]
        cmd += ["-c:v", "libx264", "-pix_fmt", "yuv420p", "-preset", X264_PRESET, "-crf", "23"]
        cmd += ["-threads", str(threads), "-movflags", "+faststart", "-y", str(path)]
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close/abort)
        try:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self._stderr
            )
        except BaseException:
            self._stderr.close()
            raise
        assert self._proc.stdin is not None
        self._stdin = self._proc.stdin
        self._fd = self._stdin.fileno()
        with contextlib.suppress(OSError, AttributeError):  # (Linux only; a lower limit)
            fcntl.fcntl(self._fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
        os.set_blocking(self._fd, False)
        self._backlog: collections.deque[memoryview] = collections.deque()
        self._pending = 0  # bytes in the backlog
        self._chunk = bytearray()  # small frames gathered

    def send(self, *parts: np.ndarray) -> None:
        """Write the C-contiguous uint8 arrays ``parts`` (the rows of one frame, in order)."""
        if self._chunk or sum(part.nbytes for part in parts) < CHUNK_BYTES:
            for part in parts:
                self._chunk += part.data.cast("B")  # (a copy: nothing of ``parts`` is kept)
            if len(self._chunk) >= CHUNK_BYTES:
                self._flush_chunk()
            return
        for part in parts:
            view = part.data.cast("B")
            self._backlog.append(view)
            self._pending += len(view)
        self._push(block=False)
        # what stays of this frame is copied (the arrays may change once this returns)
        for i in range(max(0, len(self._backlog) - len(parts)), len(self._backlog)):
            self._backlog[i] = memoryview(bytes(self._backlog[i]))
        if self._pending > BACKLOG_BYTES:
            self._push(block=True, down_to=BACKLOG_BYTES // 2)

    def close(self) -> None:
        """Write what waits, close the pipe and wait for ffmpeg to finish the file."""
        if self._chunk:
            self._flush_chunk()
        self._push(block=True, down_to=0)
        self._stdin.close()
        code = self._proc.wait()
        if code != 0:
            raise HarnessError(f"ffmpeg could not write {self.path} (exit {code}): {self._tail()}")
        self._stderr.close()

    def _flush_chunk(self) -> None:
        chunk, self._chunk = self._chunk, bytearray()
        self._backlog.append(memoryview(chunk))
        self._pending += len(chunk)
        self._push(block=False)
        if self._pending > BACKLOG_BYTES:
            self._push(block=True, down_to=BACKLOG_BYTES // 2)

    def abort(self) -> None:
        """Stop ffmpeg now."""
        with contextlib.suppress(OSError):
            self._stdin.close()
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._stderr.close()

    def _push(self, *, block: bool, down_to: int = 0) -> None:
        """Write from the backlog what the pipe takes; with ``block``, until at most
        ``down_to`` bytes wait."""
        while self._backlog and (not block or self._pending > down_to):
            view = self._backlog[0]
            try:
                n = os.write(self._fd, view)
            except BlockingIOError:
                if not block:
                    return
                while not select.select([], [self._fd], [], 1.0)[1]:
                    if self._proc.poll() is not None:
                        self._stopped()
                continue
            except BrokenPipeError:
                self._stopped()
            self._pending -= n
            if n == len(view):
                self._backlog.popleft()
            else:
                self._backlog[0] = view[n:]

    def _stopped(self) -> NoReturn:
        self._proc.wait()
        raise HarnessError(
            f"ffmpeg stopped while writing {self.path} (exit {self._proc.returncode}): "
            f"{self._tail()}"
        )

    def _tail(self) -> str:
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").strip()
        return text[-2000:] or "no message"
