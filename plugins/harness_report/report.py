"""``harness report``: check the runs and the output paths, render, write, optionally shoot.

Everything that can fail on input (a path that is not a run, an unreadable metrics.csv, an
output directory that does not exist) fails before the page is written, and the page is
written to a temporary file then renamed, so a failed report never leaves half a page.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError
from harness.rundir import check_writable_dir, locked_for_writing, run_dir_of
from harness_report import page, screenshot
from harness_report.media import DEFAULT_MAX_EMBED_MB
from harness_report.rundata import load_run


@dataclass(frozen=True)
class Result:
    page: Path
    size: int
    runs: int
    screenshot: Path | None

    def summary(self) -> str:
        text = f"wrote {self.page} ({self.size / 1e6:.1f} MB, {self.runs} run(s))"
        if self.screenshot is not None:
            text += f"; screenshot {self.screenshot}"
        return text


def default_out(runs: Sequence[Path]) -> Path:
    """RUN/report.html for one run; ./report.html for a comparison."""
    return runs[0] / "report.html" if len(runs) == 1 else Path("report.html")


def check_out(path: Path, flag: str) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; give a file name, e.g. {path / 'x'}.")
    if not parent.is_dir():
        raise ConfigError(
            f"{flag} {path}: the directory {parent} does not exist. Create it first "
            f"(mkdir -p {shlex.quote(str(parent))}) or choose a path in an existing directory."
        )
    check_writable_dir(parent, flag)  # a read-only directory: refused before rendering


def write_atomic(path: Path, text: str) -> int:
    """Write ``text`` to ``path`` through a temporary file in the same directory."""
    data = text.encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return len(data)


def make_report(
    runs: Sequence[Path],
    out: Path | None = None,
    *,
    shot: Path | None = None,
    max_embed_mb: float = DEFAULT_MAX_EMBED_MB,
) -> Result:
    """Write the report page of ``runs`` (one page for all), and a PNG of it if ``shot``."""
    if not runs:
        raise ConfigError("Give `harness report` at least one run directory.")
    if max_embed_mb < 0:
        raise ConfigError(f"--max-embed-mb {max_embed_mb} is negative; give 0 or more.")
    data = [load_run(Path(r)) for r in runs]  # reads only: a bad run stops before any write
    if out is None:
        out = default_out(runs)
        check_out(out, "the report page (--out)")
    else:
        check_out(out, "--out")
    browser = None
    if shot is not None:
        check_out(shot, "--screenshot")
        browser = screenshot.find_chromium()  # before the page: a missing browser is bad input
    # a page written into a run directory waits for no one: a run or command writing there
    # (harness run, eval) makes this one exit 2 naming it
    with locked_for_writing(run_dir_of(out.parent), "harness report"):
        size = write_atomic(out, page.render(data, out, int(max_embed_mb * 1e6)))
        if shot is not None and browser is not None:
            screenshot.capture(browser, out, shot)
    return Result(out, size, len(data), shot)
