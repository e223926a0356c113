"""The newest evaluation's video, GIF and filmstrip, embedded as data: URIs or linked.

Embedding keeps the page one file that opens anywhere, offline; base64 makes a file 4/3 its
size, so a video over the cap (``--max-embed-mb``, default 50 MB: a 1,000-frame 600x400 MP4 of
``harness eval --video`` is a few MB) is linked by its path relative to the page instead, and
the page says so.
"""

from __future__ import annotations

import base64
import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

MIME = {
    ".mp4": "video/mp4",
    ".webm": "video/webm",
    ".gif": "image/gif",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
}

DEFAULT_MAX_EMBED_MB = 50.0


@dataclass(frozen=True)
class Media:
    """A file as the page refers to it: ``src`` (data: URI or relative path), and whether it
    was embedded."""

    path: Path
    src: str
    embedded: bool
    size: int


def data_uri(path: Path) -> str:
    mime = MIME.get(path.suffix.lower(), "application/octet-stream")
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def relative_link(path: Path, page: Path) -> str:
    """``path`` relative to the page's directory, in URL form (``/`` separators)."""
    rel = os.path.relpath(path.resolve(), page.resolve().parent)
    return urllib.parse.quote(Path(rel).as_posix())


def reference(path: Path, page: Path, max_bytes: int) -> Media:
    """Embed ``path`` if it is at most ``max_bytes``, else link it relative to ``page``."""
    size = path.stat().st_size
    if size <= max_bytes:
        return Media(path, data_uri(path), True, size)
    return Media(path, relative_link(path, page), False, size)


def megabytes(size: float) -> str:
    """A size for people: 850 KB, 4.2 MB."""
    return f"{size / 1e3:.0f} KB" if size < 1e6 else f"{size / 1e6:.1f} MB"
