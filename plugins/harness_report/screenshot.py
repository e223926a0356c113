"""``harness report --screenshot PNG``: the page as headless Chromium draws it, offline.

Chromium runs in its own process group with a throwaway profile, every network request refused
(a dead proxy and a resolver that resolves nothing), and virtual time, so the shot waits for
the page's script and the video's first frames without waiting in real time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from harness.errors import ConfigError, HarnessError

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WINDOW = (1280, 1800)
"""The shot's size: the overview, three charts and the first run's video fit in 1800 px."""
TIMEOUT_S = 120.0
"""A 1280x1800 shot of a page with an embedded 5 MB video takes about 1.5 s here; 120 s is only
a guard against a browser that hangs."""

OFFLINE_FLAGS = (
    "--proxy-server=127.0.0.1:9",  # nothing listens on the discard port: any request fails
    "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND",
)


def find_chromium() -> str:
    """The browser: $HARNESS_CHROMIUM, else the first of :data:`NAMES` on PATH."""
    override = os.environ.get("HARNESS_CHROMIUM")
    if override:
        found = shutil.which(override)
        if found:
            return found
        raise ConfigError(
            f"HARNESS_CHROMIUM={override} is not an executable; point it at a Chromium or "
            f"Chrome binary, or unset it to search PATH for {', '.join(NAMES)}."
        )
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise ConfigError(
        f"--screenshot needs a headless Chromium, and none of {', '.join(NAMES)} is on PATH. "
        f"Install one (the repository's tools/install_chromium.sh installs Debian's chromium), "
        f"set HARNESS_CHROMIUM to its path, or leave out --screenshot."
    )


def chromium_command(
    binary: str, profile: Path, *mode: str, budget_ms: int = 4000, offline: bool = True
) -> list[str]:
    """A headless Chromium command line, offline unless ``offline`` is False (the dead proxy
    takes loopback too: a page served on 127.0.0.1 needs False); ``mode`` is --screenshot=...
    or --dump-dom, then the URL."""
    return [
        binary,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--hide-scrollbars",
        "--mute-audio",
        "--autoplay-policy=no-user-gesture-required",
        *(OFFLINE_FLAGS if offline else ()),
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        *mode,
    ]


def run_chromium(
    command: list[str], timeout: float = TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run ``command``; on a timeout kill its process group (Chromium's helpers with it)."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=10)
        raise HarnessError(
            f"{command[0]} did not finish within {timeout:.0f} s: {err.strip()[-600:]}"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # helpers left in the group it led
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def capture(binary: str, page: Path, png: Path) -> None:
    """Write ``png``, a :data:`WINDOW`-sized shot of the page file ``page``."""
    with tempfile.TemporaryDirectory(prefix="harness-report-chromium-") as profile:
        done = run_chromium(
            chromium_command(
                binary,
                Path(profile),
                f"--screenshot={png.resolve()}",
                f"--window-size={WINDOW[0]},{WINDOW[1]}",
                page.resolve().as_uri(),
            )
        )
    if done.returncode != 0 or not png.is_file():
        raise HarnessError(
            f"{binary} exited {done.returncode} without writing {png}: {done.stderr.strip()[-600:]}"
        )
