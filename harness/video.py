"""Films of evaluated episodes (``harness eval RUN --video``): an MP4 of every episode, a small
animated GIF and a PNG filmstrip of the first, each frame with a caption strip under it.

:class:`EpisodeRecorder` takes the frames of a one-env vector env made with
``render_mode="rgb_array"`` (the render contract, ``EnvSpec.render_modes``): one after the
reset and one after each step, so an episode of T steps gives T + 1 frames. Under SAME_STEP
autoreset, ``render()`` after the step that ends an episode already shows the next one; the
frame of the state the episode ended in comes from that step's info (:data:`FINAL_FRAME`),
where the family provides it (an episode of a family that does not has T frames).

Nothing holds a whole film: the rows of each frame and of its caption are written straight
into an ffmpeg process (:class:`FfmpegPipe`; imageio-ffmpeg's binary; H.264, yuv420p, even
dimensions, ``+faststart`` so a browser plays it while it loads), which also scales frames
wider than ``max_width`` down; the MP4 keeps the env's own size otherwise (ALE's 160x210 too:
a player enlarges it). Only a subsample of the first episode is kept for the GIF and the
filmstrip. The core imports only numpy at module level: imageio-ffmpeg and pillow are
imported when a recorder starts (a missing one names the ``video`` extra).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import HarnessError, MissingExtraError
from harness.video_pipe import FfmpegPipe, encoder_threads

log = logging.getLogger(__name__)

FINAL_FRAME = "final_frame"
"""Info key of the frame of the state an episode ended in, on the step that ends it (a
vector env merges it into ``infos["final_info"]`` with a ``_final_frame`` mask): optional for
an env family, used when present."""

CAPTION_BACKGROUND = (24, 24, 24)
"""The caption strip's colour (near-black; the text is near-white)."""

DEFAULT_FPS = 30.0
"""Frames per second when the env's metadata has no ``render_fps``."""

CAPTION_LINE = 24
"""Pixels of a caption line under an MP4 frame, in the film (a 14-px font); frames narrower
than :data:`NARROW_WIDTH` get :data:`CAPTION_LINE_NARROW`. A caption takes as many lines as
its widest form needs at the frame's width (ALE's 160: two)."""

CAPTION_LINE_NARROW = 16
"""A caption line's pixels under a frame narrower than :data:`NARROW_WIDTH` (a 9-px font)."""

NARROW_WIDTH = 320
"""Frames narrower than this get the small caption font in the MP4, and are enlarged by a
whole factor (nearest neighbour, pixels kept sharp) to at least this width in the GIF."""

GIF_WIDTH = 320
"""The GIF's width at most (frames are shrunk to it)."""

GIF_MAX_BYTES = 2_000_000
"""The GIF is written with fewer frames until it is smaller than this."""

POOL_FRAMES = 64
"""First-episode frames kept for the GIF and the filmstrip at most: past it every other one
is dropped and the stride doubles. Kept as rendered (a copy: 0.04 ms for CartPole's where
shrinking it took 1 ms of the evaluation's thread) up to :data:`POOL_FRAME_BYTES` each: 64
CartPole frames are 49 MB while recording."""

POOL_FRAME_BYTES = 1 << 20
"""Larger frames are shrunk to :data:`GIF_WIDTH` as they are pooled."""

STRIP_FRAMES = 8
"""Frames side by side in the filmstrip."""

STRIP_WIDTH = 240
"""Width of a filmstrip tile at most."""


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


CAPTION_MARGIN = 6
"""Pixels left of a caption line's text."""


class Captioner:
    """Draws caption strips (pillow's default font, white on near-black) from glyph tiles
    drawn once per character and line height: drawing the caption with FreeType on every
    frame took 0.5 ms of the evaluation's thread per frame (cProfile, 600-px CartPole
    frames), more than the encoder left it; the tiles ignore kerning, which a caption does
    not need. A caption's fields (separated by two spaces) wrap onto more lines where one
    line is too narrow."""

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

    def width(self, text: str, line: int) -> int:
        """Pixels ``text`` takes on a line of height ``line``, its margin included."""
        return CAPTION_MARGIN + sum(int(self.glyph(char, line).shape[1]) for char in text)

    def lines(self, text: str, width: int, line: int) -> list[str]:
        """``text``'s fields packed greedily into lines that fit ``width`` pixels (a field
        wider than the line gets a line of its own and is cut at the edge)."""
        out: list[str] = []
        for field in text.split("  "):
            if out and self.width(out[-1] + "  " + field, line) <= width:
                out[-1] += "  " + field
            else:
                out.append(field)
        return out

    def strip(self, text: str, width: int, line: int, lines: int = 1) -> np.ndarray:
        """A ``(lines * line, width, 3)`` uint8 strip with ``text`` on it: on one line, or
        wrapped onto ``lines`` lines (the last takes what does not fit)."""
        if lines == 1:
            return self._row(text, width, line)
        rows = self.lines(text, width, line)
        if len(rows) > lines:
            rows = [*rows[: lines - 1], "  ".join(rows[lines - 1 :])]
        rows += [""] * (lines - len(rows))
        return np.concatenate([self._row(row, width, line) for row in rows], axis=0)

    def under(self, frame: np.ndarray, text: str, line: int) -> np.ndarray:
        """``frame`` with a caption strip under it (as many lines of ``line`` pixels as
        ``text`` needs at the frame's width)."""
        lines = len(self.lines(text, frame.shape[1], line))
        return np.concatenate([frame, self.strip(text, frame.shape[1], line, lines)], axis=0)

    def _row(self, text: str, width: int, line: int) -> np.ndarray:
        tiles = [self.glyph(char, line) for char in text]
        row = np.concatenate([self.glyph(" ", line)[:, :CAPTION_MARGIN], *tiles], axis=1)
        row = row[:, :width]
        if row.shape[1] < width:
            pad = np.full((line, width - row.shape[1], 3), CAPTION_BACKGROUND, np.uint8)
            row = np.concatenate([row, pad], axis=1)
        return row

    def glyph(self, char: str, height: int) -> np.ndarray:
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


def caption(episode: int, episodes: int, step: int, ret: float, score: float | None) -> str:
    """'episode 2/3  step 140  return 57.3' (and the official score when reported)."""
    text = f"episode {episode}/{episodes}  step {step}  return {ret:.1f}"
    if score is not None and math.isfinite(score):
        text += f"  score {score:.3f}"
    return text


class CaptionStrip:
    """A film's caption strip, updated in place: each line is redrawn from the first
    character that differs from the previous frame's (a step's caption changes a few
    digits), so a frame costs a few glyph copies where pasting the whole caption took 0.1 ms
    and wrapping it 0.08 ms more (Pong, dev VM). Lines hold a fixed number of the caption's
    fields (``groups``, from its widest form; the last line takes the rest). The buffer is
    reused: :meth:`FfmpegPipe.send` keeps no reference to what it was given."""

    def __init__(self, captioner: Captioner, width: int, line: int, groups: list[int]) -> None:
        self._captioner = captioner
        self._width, self._line, self._groups = width, line, groups
        self.buffer = np.full((line * len(groups), width, 3), CAPTION_BACKGROUND, np.uint8)
        self._texts = [""] * len(groups)
        self._ends = [[CAPTION_MARGIN] for _ in groups]  # x where each character ends

    def update(self, text: str) -> np.ndarray:
        """The strip showing ``text``."""
        fields = text.split("  ")
        start = 0
        for r, count in enumerate(self._groups):
            last = r == len(self._groups) - 1
            row = "  ".join(fields[start:] if last else fields[start : start + count])
            start += count
            if row != self._texts[r]:
                self._redraw(r, row)
        return self.buffer

    def _redraw(self, r: int, row: str) -> None:
        old, ends = self._texts[r], self._ends[r]
        same = next(
            (i for i, (a, b) in enumerate(zip(old, row, strict=False)) if a != b),
            min(len(old), len(row)),
        )
        band = self.buffer[r * self._line : (r + 1) * self._line]
        ends = ends[: same + 1]
        x = ends[-1]
        for char in row[same:]:
            if x >= self._width:
                break
            tile = self._captioner.glyph(char, self._line)
            w = min(tile.shape[1], self._width - x)
            band[:, x : x + w] = tile[:, :w]
            x += w
            ends.append(x)
        old_end = min(self._ends[r][-1], self._width)
        if old_end > x:
            band[:, x:old_end] = CAPTION_BACKGROUND
        self._texts[r], self._ends[r] = row, ends


@dataclass(frozen=True)
class FilmLayout:
    """How the frames of one film go into ffmpeg: fixed by its first frame."""

    shape: tuple[int, ...]
    """The rendered frames' shape (H, W, 3)."""
    line: int
    """Pixels of a caption line, at the rendered size."""
    groups: list[int]
    """Caption fields on each caption line under the frame."""
    size: tuple[int, int]
    """(width, height) written into ffmpeg: the frame and its caption."""
    out: tuple[int, int]
    """(width, height) of the MP4 (even)."""
    filters: str | None
    """ffmpeg's filter: a scale down to ``out``, or a pad to even sides, or none."""


def film_layout(
    captioner: Captioner, shape: tuple[int, ...], episodes: int, max_width: int | None
) -> FilmLayout:
    """The layout of a film of frames of ``shape``: the MP4 at the rendered size, or scaled
    down to ``max_width`` (by ffmpeg, on its own core), with a caption that looks the same
    in the film either way (drawn at the scale ffmpeg then reduces)."""
    height, width = shape[:2]
    out_w = width if not max_width or width <= max_width else max(2, max_width - max_width % 2)
    factor = width / out_w
    line_out = CAPTION_LINE if out_w >= NARROW_WIDTH else CAPTION_LINE_NARROW
    line = max(8, round(line_out * factor))
    widest = caption(episodes, episodes, 99999, -99999.9, 0.0)
    groups = [len(row.split("  ")) for row in captioner.lines(widest, width, line)]
    size = (width, height + len(groups) * line)
    if out_w == width:
        out = (width + width % 2, size[1] + size[1] % 2)
        filters = None if out == size else "pad=ceil(iw/2)*2:ceil(ih/2)*2"
    else:
        out = (out_w, max(2, round(size[1] / factor / 2) * 2))
        filters = f"scale={out[0]}:{out[1]}:flags=area"
    return FilmLayout(tuple(shape), line, groups, size, out, filters)


def contiguous(frame: np.ndarray) -> np.ndarray:
    """``frame`` as a C-contiguous array (itself when it is one). A transposed view of a
    (W, H, 3) array, as gymnasium's classic control renders through pygame, is copied pixel
    by pixel as 3-byte items: 0.59 ms for a 600x400 frame where numpy's byte-wise copy took
    1.22 ms (dev VM)."""
    if frame.flags.c_contiguous:
        return frame
    base = frame.transpose(1, 0, 2)
    if base.flags.c_contiguous:
        pixels = base.view(np.dtype((np.void, 3)))[..., 0]  # (W, H) of 3-byte items
        copied: np.ndarray = np.ascontiguousarray(pixels.T).view(np.uint8)
        return copied.reshape(frame.shape)
    return np.ascontiguousarray(frame)


class EpisodeRecorder:
    """Films the episodes of a one-env vector env into ``base``.mp4 (+ .gif, -filmstrip.png).

    The evaluation calls :meth:`start` after its reset, :meth:`after_step` after every step
    and :meth:`close` at the end (:meth:`abort` when it fails: partial files are removed).
    ``max_width``: frames wider than this many pixels are scaled down in the MP4 (None: the
    rendered size). Frames are kept by reference (as gymnasium's RecordVideo keeps them): a
    renderer returns a new array each call, or one it does not write into again."""

    def __init__(
        self,
        base: Path,
        *,
        episodes: int,
        fps: float | None = None,
        env_id: str = "",
        max_width: int | None = None,
    ) -> None:
        self.mp4, self.gif, self.filmstrip = video_paths(base)
        self.episodes = episodes
        self.fps = fps
        self.env_id = env_id
        self.max_width = max_width
        self._ffmpeg, self._image, draw, font = _video_modules(
            f"filming episodes (harness eval --video) of {env_id or 'the env'}"
        )
        self._captioner = Captioner(self._image, draw, font)
        self._writer: FfmpegPipe | None = None
        self._layout: FilmLayout | None = None
        self._strip: CaptionStrip | None = None
        self._frames = 0
        self._episode = 1
        self._step = 0
        self._return = 0.0
        self._pool: list[tuple[np.ndarray, str]] = []  # first episode: (frame, caption)
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
        except HarnessError:  # (ffmpeg failed at the end: a full disk)
            self._writer = None
            self.abort()
            raise
        self._writer = None
        if self._episode == 1 and self._last is not None:  # (the first episode never ended)
            self._keep_last()
        try:
            self._write_gif()
            self._write_filmstrip()
        except OSError as exc:
            self.abort()
            raise HarnessError(
                f"--video: could not write {self.gif.name} or {self.filmstrip.name} in "
                f"{self.gif.parent}: {exc}"
            ) from exc
        return VideoFiles(self.mp4, self.gif, self.filmstrip, self._frames)

    def abort(self) -> None:
        """Stop ffmpeg and remove what was written (a failed evaluation leaves no half
        film)."""
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        for path in (self.mp4, self.gif, self.filmstrip):
            path.unlink(missing_ok=True)

    # -- frames ----------------------------------------------------------------------------
    def _frame(self, frame: np.ndarray, score: float | None = None) -> None:
        """One frame into the MP4: its rows, then its caption's (no composed copy)."""
        raw = self._checked(frame)
        layout = self._layout
        assert layout is not None
        text = caption(self._episode, self.episodes, self._step, self._return, score)
        if self._writer is None:
            self._open(layout)
            self._strip = CaptionStrip(self._captioner, layout.shape[1], layout.line, layout.groups)
        assert self._writer is not None and self._strip is not None
        self._writer.send(contiguous(raw), self._strip.update(text))
        self._frames += 1
        if self._episode == 1:
            self._last = (raw, text)
            if self._step % self._stride == 0:
                self._pool.append((self._pooled(raw), text))
                if len(self._pool) > POOL_FRAMES:
                    self._pool = self._pool[::2]
                    self._stride *= 2

    def _checked(self, frame: Any) -> np.ndarray:
        """The frame as a (H, W, 3) uint8 array of the first frame's shape (the contract)."""
        if self._layout is None:
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
            self._layout = film_layout(self._captioner, frame.shape, self.episodes, self.max_width)
        elif getattr(frame, "shape", None) != self._layout.shape:
            raise HarnessError(
                f"The env {self.env_id!r} rendered a frame of shape "
                f"{getattr(frame, 'shape', None)} after frames of {self._layout.shape}: a "
                f"renderer must keep one frame size (the render contract, docs/video.md)."
            )
        checked: np.ndarray = frame
        return checked

    def _open(self, layout: FilmLayout) -> None:
        self.mp4.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._writer = FfmpegPipe(
                self._ffmpeg.get_ffmpeg_exe(),
                self.mp4,
                layout.size,
                float(self.fps or DEFAULT_FPS),
                layout.filters,
                encoder_threads(),
            )
        except (OSError, RuntimeError) as exc:  # (RuntimeError: imageio-ffmpeg found none)
            raise HarnessError(
                f"--video: could not start ffmpeg for {self.mp4}: {exc}. Reinstall the video "
                f"extra (pip install 'harness[video]'), or set IMAGEIO_FFMPEG_EXE to an ffmpeg "
                f"with libx264."
            ) from exc

    def _pooled(self, frame: np.ndarray) -> np.ndarray:
        """A first-episode frame as the pool keeps it: by reference, or shrunk if large."""
        if frame.nbytes <= POOL_FRAME_BYTES:
            return frame
        return self._small(frame, GIF_WIDTH)

    def _small(self, frame: np.ndarray, width: int) -> np.ndarray:
        """``frame`` shrunk to at most ``width`` pixels wide (even height), or as it is."""
        height, w = frame.shape[:2]
        if w <= width:
            return frame
        new_h = max(2, round(height * width / w) // 2 * 2)
        image = self._image.fromarray(frame).resize((width, new_h), self._image.Resampling.BOX)
        return np.asarray(image)

    def _gif_frame(self, frame: np.ndarray) -> np.ndarray:
        """A pooled frame at the GIF's size: shrunk to :data:`GIF_WIDTH`, or a narrow one
        enlarged by a whole factor (nearest neighbour) to at least :data:`NARROW_WIDTH`."""
        width = frame.shape[1]
        if width < NARROW_WIDTH:
            scale = math.ceil(NARROW_WIDTH / width)
            frame = frame.repeat(scale, axis=0).repeat(scale, axis=1)
        return self._small(frame, GIF_WIDTH)

    def _keep_last(self) -> None:
        """The first episode's last frame joins the pool (the filmstrip ends on it)."""
        assert self._last is not None
        frame, text = self._last
        if not self._pool or self._pool[-1][1] != text:
            self._pool.append((self._pooled(frame), text))
        self._last = None

    # -- GIF and filmstrip -----------------------------------------------------------------
    def _write_gif(self) -> None:
        """The pooled frames as a looping GIF under :data:`GIF_MAX_BYTES` (fewer frames,
        each shown longer, until it fits). One palette for every frame, from a mosaic of
        eight of them, and no per-frame palette optimisation: 64 Pong frames of 320x468 took
        50 ms where a palette per frame (FASTOCTREE) and pillow's optimising writer took
        275 ms, 10% of a 3-episode evaluation (dev VM); rendered scenes keep their few
        colours throughout. (A thread writing it while the next episodes ran was slower
        still: it and the evaluation took turns at the GIL.)"""
        pool, stride = self._pool, self._stride
        line = CAPTION_LINE_NARROW
        widest = caption(self.episodes, self.episodes, 99999, -99999.9, 0.0)
        shown = [self._gif_frame(f) for f, _ in pool]
        lines = len(self._captioner.lines(widest, shown[0].shape[1], line))
        rgb = [
            np.concatenate([f, self._captioner.strip(t, f.shape[1], line, lines)], axis=0)
            for f, (_, t) in zip(shown, pool, strict=True)
        ]
        sample = np.linspace(0, len(rgb) - 1, min(8, len(rgb))).round().astype(int)
        mosaic = self._image.fromarray(np.concatenate([rgb[i] for i in sample], axis=1))
        palette = mosaic.quantize(256, self._image.Quantize.FASTOCTREE)
        none = self._image.Dither.NONE
        frames = [self._image.fromarray(f).quantize(palette=palette, dither=none) for f in rgb]
        while True:
            ms = max(20, round(1000 * stride / float(self.fps or DEFAULT_FPS)))
            frames[0].save(
                self.gif,
                save_all=True,
                append_images=frames[1:],
                duration=ms,
                loop=0,
                optimize=False,
            )
            if self.gif.stat().st_size <= GIF_MAX_BYTES or len(frames) <= 8:
                return
            frames, stride = frames[::2], stride * 2

    def _write_filmstrip(self) -> None:
        """:data:`STRIP_FRAMES` pooled frames, first to last evenly, side by side."""
        pool = self._pool
        index = np.unique(np.linspace(0, len(pool) - 1, min(STRIP_FRAMES, len(pool))).round())
        tiles = []
        for i in index.astype(int):
            frame, text = pool[i]
            short = text.split("  return")[0].split("  ", 1)[-1]  # "step 140"
            tiles.append(
                self._captioner.under(self._small(frame, STRIP_WIDTH), short, CAPTION_LINE_NARROW)
            )
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
