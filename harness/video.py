"""Films of evaluated episodes (``harness eval RUN --video``): an MP4 of every episode, a small
animated GIF and a PNG filmstrip of the first, each frame with a caption strip under it.

:class:`EpisodeRecorder` takes the frames of a one-env vector env made with
``render_mode="rgb_array"`` (the render contract, ``EnvSpec.render_modes``): one after the
reset and one after each step, so an episode of T steps gives T + 1 frames. Under SAME_STEP
autoreset, ``render()`` after the step that ends an episode already shows the next one; the
frame of the state the episode ended in comes from that step's info (:data:`FINAL_FRAME`),
where the family provides it (an episode of a family that does not has T frames).

Nothing holds a whole film: MP4 frames stream into an ffmpeg process (imageio-ffmpeg's
``write_frames``; H.264, yuv420p, even dimensions, ``+faststart`` so a browser plays it while
it loads), and only a subsample of the first episode, already shrunk, is kept for the GIF and
the filmstrip. The core imports only numpy at module level: imageio-ffmpeg and pillow are
imported when a recorder starts (a missing one names the ``video`` extra).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import HarnessError, MissingExtraError

log = logging.getLogger(__name__)

FINAL_FRAME = "final_frame"
"""Info key of the frame of the state an episode ended in, on the step that ends it (a
vector env merges it into ``infos["final_info"]`` with a ``_final_frame`` mask): optional for
an env family, used when present."""

CAPTION_BACKGROUND = (24, 24, 24)
"""The caption strip's colour (near-black; the text is near-white)."""

DEFAULT_FPS = 30.0
"""Frames per second when the env's metadata has no ``render_fps``."""

CAPTION_HEIGHT = 24
"""Pixels of the caption strip under each MP4 frame (even: yuv420p halves the chroma)."""

MIN_WIDTH = 320
"""Narrower frames (ALE's 160) are enlarged by a whole factor (nearest neighbour) to at
least this width, so the caption fits and the pixels stay sharp."""

GIF_WIDTH = 320
"""The GIF's width at most (frames are shrunk to it)."""

GIF_MAX_BYTES = 2_000_000
"""The GIF is written with fewer frames until it is smaller than this."""

POOL_FRAMES = 96
"""First-episode frames kept for the GIF and the filmstrip at most: past it every other one
is dropped and the stride doubles. 96 frames of 320x240 are 22 MB while recording."""

STRIP_FRAMES = 8
"""Frames side by side in the filmstrip."""

STRIP_WIDTH = 240
"""Width of a filmstrip tile at most."""

X264_OPTIONS = (
    "-preset", "superfast", "-threads", "1", "-crf", "23", "-movflags", "+faststart",
)  # fmt: skip
"""ffmpeg output options. ffmpeg encodes in its own process beside the evaluation, so what
counts is that it keeps up with the env on one core of its own: 600x424 CartPole frames, quiet
2-core VM, ms per frame with ``-threads 1`` / x264's automatic threads: ultrafast 1.16 / 1.50,
superfast 1.17 / 1.72, veryfast 1.36 / 1.53 (the default ``medium`` about twice veryfast).
More threads only took the evaluation's core."""


QUEUE_FRAMES = 16
"""Frames waiting for ffmpeg at most (16 CartPole frames with captions are 12 MB)."""


class FrameSink:
    """Feeds frames to an imageio-ffmpeg writer from a thread of its own, so the evaluation
    steps while ffmpeg encodes: writing into ffmpeg's pipe blocks until it has encoded, and
    that wait was 5 ms of the 6 ms a 600x424 CartPole frame cost the evaluation (cProfile,
    dev VM). The pipe write releases the GIL. At most :data:`QUEUE_FRAMES` wait (bounded
    memory); an ffmpeg failure is raised by the next :meth:`send` or by :meth:`close`."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer
        self._queue: queue.Queue[np.ndarray | None] = queue.Queue(QUEUE_FRAMES)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="harness-video", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._writer.send(None)  # (starts ffmpeg)
            while (frame := self._queue.get()) is not None:
                self._writer.send(frame)
            self._writer.close()
        except BaseException as exc:  # (handed to the evaluation's thread)
            self._error = exc
            while self._queue.get() is not None:  # drain: send() must not block forever
                pass

    def send(self, frame: np.ndarray) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(frame)

    def close(self) -> None:
        """Wait for ffmpeg to finish the file."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


@dataclass(frozen=True)
class VideoFiles:
    """What a recorder wrote (None where nothing was: no episode was filmed)."""

    mp4: Path | None
    """Every filmed episode, one after the other."""
    gif: Path | None
    """The first episode, small and subsampled (for docs)."""
    filmstrip: Path | None
    """:data:`STRIP_FRAMES` frames of the first episode side by side (PNG)."""
    frames: int
    """Frames written to the MP4."""


def video_paths(base: Path) -> tuple[Path, Path, Path]:
    """The MP4, GIF and filmstrip files of ``base`` (a path without suffix)."""
    return (
        base.with_name(base.name + ".mp4"),
        base.with_name(base.name + ".gif"),
        base.with_name(base.name + "-filmstrip.png"),
    )


def render_fps(envs: Any) -> float:
    """The env's own frame rate (``metadata["render_fps"]``), else :data:`DEFAULT_FPS`."""
    metadata = getattr(envs, "metadata", None)
    fps = metadata.get("render_fps") if isinstance(metadata, Mapping) else None
    if isinstance(fps, int | float) and fps > 0:
        return float(fps)
    return DEFAULT_FPS


def _video_modules(what: str) -> tuple[Any, Any, Any, Any]:
    """imageio-ffmpeg and pillow's Image, ImageDraw, ImageFont (the ``video`` extra)."""
    try:
        import imageio_ffmpeg  # type: ignore[import-untyped, unused-ignore]
    except ModuleNotFoundError as exc:
        raise MissingExtraError("video", "imageio_ffmpeg", what) from exc
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ModuleNotFoundError as exc:
        raise MissingExtraError("video", "PIL", what) from exc
    return imageio_ffmpeg, Image, ImageDraw, ImageFont


class Captioner:
    """Draws the caption strip under a frame (pillow's default font, white on near-black)."""

    def __init__(self, image: Any, draw: Any, font_module: Any) -> None:
        self._image, self._draw = image, draw
        self._fonts: dict[int, Any] = {}
        self._glyphs: dict[tuple[str, int], np.ndarray] = {}
        self._font_module = font_module

    def font(self, size: int) -> Any:
        if size not in self._fonts:
            try:  # a scalable font (pillow >= 10.1 with FreeType)
                self._fonts[size] = self._font_module.load_default(size=size)
            except (TypeError, ImportError, OSError):  # the old fixed bitmap font
                self._fonts[size] = self._font_module.load_default()
        return self._fonts[size]

    def strip(self, text: str, width: int, height: int) -> np.ndarray:
        """A ``(height, width, 3)`` uint8 strip with ``text`` on it, pasted from glyph tiles
        drawn once per character: drawing the caption with FreeType on every frame took 0.5
        ms of the evaluation's thread per frame (cProfile, 600-px CartPole frames), more than
        the encoder left it; the tiles ignore kerning, which a caption does not need."""
        tiles = [self._glyph(char, height) for char in text]
        row = np.concatenate([self._glyph(" ", height)[:, :6], *tiles], axis=1)[:, :width]
        if row.shape[1] < width:
            pad = np.full((height, width - row.shape[1], 3), CAPTION_BACKGROUND, np.uint8)
            row = np.concatenate([row, pad], axis=1)
        return row

    def _glyph(self, char: str, height: int) -> np.ndarray:
        """``char`` drawn on the caption's background, a tile as wide as its advance."""
        tile = self._glyphs.get((char, height))
        if tile is None:
            size = max(8, height * 7 // 12)
            font = self.font(size)
            width = max(1, round(font.getlength(char)))
            image = self._image.new("RGB", (width, height), CAPTION_BACKGROUND)
            self._draw.Draw(image).text(
                (0, (height - size) // 2 - 1), char, fill=(235, 235, 235), font=font
            )
            tile = self._glyphs[(char, height)] = np.asarray(image)
        return tile

    def under(self, frame: np.ndarray, text: str, height: int) -> np.ndarray:
        """``frame`` with a caption strip of ``height`` pixels under it."""
        return np.concatenate([frame, self.strip(text, frame.shape[1], height)], axis=0)


def caption(episode: int, episodes: int, step: int, ret: float, score: float | None) -> str:
    """'episode 2/3  step 140  return 57.3' (and the official score when reported)."""
    text = f"episode {episode}/{episodes}  step {step}  return {ret:.1f}"
    if score is not None and math.isfinite(score):
        text += f"  score {score:.3f}"
    return text


class EpisodeRecorder:
    """Films the episodes of a one-env vector env into ``base``.mp4 (+ .gif, -filmstrip.png).

    The evaluation calls :meth:`start` after its reset, :meth:`after_step` after every step
    and :meth:`close` at the end (:meth:`abort` when it fails: partial files are removed)."""

    def __init__(
        self, base: Path, *, episodes: int, fps: float | None = None, env_id: str = ""
    ) -> None:
        self.mp4, self.gif, self.filmstrip = video_paths(base)
        self.episodes = episodes
        self.fps = fps
        self.env_id = env_id
        self._ffmpeg, self._image, draw, font = _video_modules(
            f"filming episodes (harness eval --video) of {env_id or 'the env'}"
        )
        self._captioner = Captioner(self._image, draw, font)
        self._writer: Any = None
        self._shape: tuple[int, ...] | None = None  # of the first frame (raw)
        self._scale = 1
        self._pad = (0, 0)
        self._frames = 0
        self._episode = 1
        self._step = 0
        self._return = 0.0
        self._pool: list[tuple[np.ndarray, str]] = []  # first episode: (small frame, caption)
        self._stride = 1
        self._last: tuple[np.ndarray, str] | None = None  # the first episode's latest frame

    # -- the evaluation's calls ------------------------------------------------------------
    def start(self, envs: Any) -> None:
        """After the (seeded) reset: the first frame; the frame rate from the env when not
        given."""
        if self.fps is None:
            self.fps = render_fps(envs)
        self._frame(_first_frame(envs))

    def after_step(
        self,
        envs: Any,
        reward: float,
        ended: bool,
        infos: Mapping[str, Any],
        metrics: Mapping[str, float],
    ) -> None:
        """After a step: its frame, or for the step that ends an episode the final frame
        (from the step's info) and then, if more episodes follow, the next one's first."""
        self._step += 1
        self._return += reward
        if not ended:
            self._frame(_first_frame(envs))
            return
        final = final_frame(infos, 0)
        if final is not None:
            self._frame(final, metrics.get("score"))
        if self._episode == 1 and self._last is not None:
            self._keep_last()
        self._episode += 1
        self._step, self._return = 0, 0.0
        if self._episode <= self.episodes:
            self._frame(_first_frame(envs))

    def close(self) -> VideoFiles:
        """Finish the MP4 and write the GIF and the filmstrip of the first episode."""
        if self._writer is None:
            return VideoFiles(None, None, None, 0)
        try:
            self._writer.close()
        except Exception as exc:  # (ffmpeg failed at the end: a full disk)
            self._writer = None
            self.abort()
            raise HarnessError(f"ffmpeg could not finish {self.mp4}: {exc}") from exc
        self._writer = None
        if self._episode == 1 and self._last is not None:  # (the first episode never ended)
            self._keep_last()
        self._write_gif()
        self._write_filmstrip()
        return VideoFiles(self.mp4, self.gif, self.filmstrip, self._frames)

    def abort(self) -> None:
        """Stop ffmpeg and remove what was written (a failed evaluation leaves no half
        film)."""
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # (the evaluation's own error is the one to see)
                log.debug("ffmpeg did not close cleanly", exc_info=True)
            self._writer = None
        for path in (self.mp4, self.gif, self.filmstrip):
            path.unlink(missing_ok=True)

    # -- frames ----------------------------------------------------------------------------
    def _frame(self, frame: np.ndarray, score: float | None = None) -> None:
        raw = self._checked(frame)
        text = caption(self._episode, self.episodes, self._step, self._return, score)
        out = self._composed(raw, text)
        frame = out[:-CAPTION_HEIGHT]
        if self._writer is None:
            self._open(out.shape[1], out.shape[0])
        self._writer.send(out)
        self._frames += 1
        if self._episode == 1:
            self._last = (frame, text)
            if self._step % self._stride == 0:
                self._pool.append((self._small(frame, GIF_WIDTH), text))
                if len(self._pool) > POOL_FRAMES:
                    self._pool = self._pool[::2]
                    self._stride *= 2

    def _composed(self, raw: np.ndarray, text: str) -> np.ndarray:
        """The MP4 frame: ``raw`` enlarged by the whole factor, padded to even sides, with
        its caption strip under it, written into one new array (``repeat`` twice, ``pad``
        and ``concatenate``: 0.37 ms of the evaluation's thread per Pong frame)."""
        height, width = raw.shape[:2]
        s = self._scale
        out = np.zeros(
            (height * s + self._pad[0] + CAPTION_HEIGHT, width * s + self._pad[1], 3), np.uint8
        )
        if s == 1:
            out[:height, :width] = raw
        else:  # nearest neighbour: each row widened once, then written s times (0.19 ms a
            # Pong frame; a 5-d broadcast of single pixels took 0.7 ms, repeat twice 0.37 ms)
            rows = out[: height * s, : width * s].reshape(height, s, width * s, 3)  # (a view)
            rows[:] = raw.repeat(s, axis=1)[:, None]
        out[-CAPTION_HEIGHT:] = self._captioner.strip(text, out.shape[1], CAPTION_HEIGHT)
        return out

    def _checked(self, frame: Any) -> np.ndarray:
        """The frame as a (H, W, 3) uint8 array of the first frame's shape (the contract)."""
        if self._shape is None:
            if (
                not isinstance(frame, np.ndarray)
                or frame.ndim != 3
                or frame.shape[2] != 3
                or frame.dtype != np.uint8
            ):
                raise HarnessError(
                    f"The env {self.env_id!r} rendered {type(frame).__name__} "
                    f"{getattr(frame, 'shape', '')} {getattr(frame, 'dtype', '')}, not an "
                    f"(H, W, 3) uint8 frame (the render contract, docs/video.md)."
                )
            self._shape = frame.shape
            height, width = frame.shape[:2]
            self._scale = max(1, math.ceil(MIN_WIDTH / width))
            self._pad = ((height * self._scale) % 2, (width * self._scale) % 2)
        elif getattr(frame, "shape", None) != self._shape:
            raise HarnessError(
                f"The env {self.env_id!r} rendered a frame of shape "
                f"{getattr(frame, 'shape', None)} after frames of {self._shape}: a renderer "
                f"must keep one frame size (the render contract, docs/video.md)."
            )
        checked: np.ndarray = frame
        return checked

    def _open(self, width: int, height: int) -> None:
        self.mp4.parent.mkdir(parents=True, exist_ok=True)
        writer = self._ffmpeg.write_frames(
            str(self.mp4),
            (width, height),
            fps=float(self.fps or DEFAULT_FPS),
            codec="libx264",
            pix_fmt_in="rgb24",
            pix_fmt_out="yuv420p",
            quality=None,
            macro_block_size=2,  # (the size is even: no rescaling)
            output_params=list(X264_OPTIONS),
        )
        self._writer = FrameSink(writer)

    def _small(self, frame: np.ndarray, width: int) -> np.ndarray:
        """``frame`` shrunk to at most ``width`` pixels wide (even height)."""
        height, w = frame.shape[:2]
        if w <= width:
            return frame.copy()
        new_h = max(2, round(height * width / w) // 2 * 2)
        image = self._image.fromarray(frame).resize((width, new_h), self._image.Resampling.BOX)
        return np.asarray(image)

    def _keep_last(self) -> None:
        """The first episode's last frame joins the pool (the filmstrip ends on it)."""
        assert self._last is not None
        frame, text = self._last
        if not self._pool or self._pool[-1][1] != text:
            self._pool.append((self._small(frame, GIF_WIDTH), text))
        self._last = None

    # -- GIF and filmstrip -----------------------------------------------------------------
    def _write_gif(self) -> None:
        """The pooled frames as a looping GIF under :data:`GIF_MAX_BYTES` (fewer frames,
        each shown longer, until it fits)."""
        pool, stride = self._pool, self._stride
        while True:
            # FASTOCTREE: 2.5 ms a 320x226 frame where the median cut of convert("P",
            # ADAPTIVE) took 12.5 ms (dev VM), alike to the eye on rendered scenes
            fast = self._image.Quantize.FASTOCTREE
            images = [
                self._image.fromarray(self._captioner.under(f, t, 16)).quantize(256, fast)
                for f, t in pool
            ]
            ms = max(20, round(1000 * stride / float(self.fps or DEFAULT_FPS)))
            images[0].save(self.gif, save_all=True, append_images=images[1:], duration=ms, loop=0)
            if self.gif.stat().st_size <= GIF_MAX_BYTES or len(pool) <= 8:
                return
            pool, stride = pool[::2], stride * 2

    def _write_filmstrip(self) -> None:
        """:data:`STRIP_FRAMES` pooled frames, first to last evenly, side by side."""
        pool = self._pool
        index = np.unique(np.linspace(0, len(pool) - 1, min(STRIP_FRAMES, len(pool))).round())
        tiles = []
        for i in index.astype(int):
            frame, text = pool[i]
            short = text.split("  return")[0].split("  ", 1)[-1]  # "step 140"
            tiles.append(self._captioner.under(self._small(frame, STRIP_WIDTH), short, 16))
        height = max(t.shape[0] for t in tiles)
        gap = np.full((height, 4, 3), 255, np.uint8)
        row: list[np.ndarray] = []
        for tile in tiles:
            if tile.shape[0] < height:
                tile = np.pad(tile, ((0, height - tile.shape[0]), (0, 0), (0, 0)))
            row += [tile, gap]
        self._image.fromarray(np.concatenate(row[:-1], axis=1)).save(self.filmstrip)


def _first_frame(envs: Any) -> np.ndarray:
    """Env 0's frame of a vector env's ``render()``."""
    frames = envs.render()
    if frames is None or len(frames) < 1:
        raise HarnessError(
            f"render() returned {frames!r}: a vector env made with render_mode='rgb_array' "
            f"returns one frame per env (the render contract, docs/video.md)."
        )
    frame: np.ndarray = frames[0]
    return frame


def final_frame(infos: Mapping[str, Any], i: int) -> np.ndarray | None:
    """Env ``i``'s :data:`FINAL_FRAME` from the infos of the vector step that ended its
    episode (merged into ``infos["final_info"]``), or None."""
    final = infos.get("final_info")
    if not isinstance(final, Mapping) or FINAL_FRAME not in final:
        return None
    mask = final.get("_" + FINAL_FRAME)
    if mask is not None and not mask[i]:
        return None
    frame = final[FINAL_FRAME][i]
    return np.asarray(frame) if isinstance(frame, np.ndarray) else None
