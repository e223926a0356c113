"""Headless Chromium for the browser tests (the report page, the cluster's web monitor).

``chromium_binary()`` finds the browser ($HARNESS_CHROMIUM, else PATH), running
``tools/install_chromium.sh`` once when it is missing, and skips the test only if it is still
missing. ``open_page()`` runs one headless Chromium with the network refused (a dead proxy, a
resolver that resolves nothing; ``offline=False`` for a page served on loopback, such as the
monitor's), its own process group (killed if it overruns) and a throwaway profile. Set
``HARNESS_ARTIFACTS=DIR`` to keep screenshots there as well as under ``tmp_path``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from functools import cache
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness_report.screenshot import chromium_command, run_chromium

REPO = Path(__file__).resolve().parents[1]
INSTALL_SCRIPT = REPO / "tools" / "install_chromium.sh"
BROWSER_TIMEOUT_S = 90.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _find() -> str | None:
    override = os.environ.get("HARNESS_CHROMIUM")
    if override:
        return shutil.which(override) or (override if os.access(override, os.X_OK) else None)
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@cache
def _install_note() -> str:
    if not INSTALL_SCRIPT.exists():
        return "tools/install_chromium.sh is missing"
    try:
        r = subprocess.run(
            ["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=600, check=False
        )
    except subprocess.TimeoutExpired:
        return "tools/install_chromium.sh did not finish within 600 s"
    return (r.stdout + r.stderr)[-600:].strip()


def chromium_binary() -> str:
    """The browser, or a skip that says how to install it."""
    found = _find()
    if found:
        return found
    note = _install_note()
    found = _find()
    if found:
        return found
    pytest.skip(
        "chromium is not installed and could not be installed here (run "
        f"tools/install_chromium.sh, or set HARNESS_CHROMIUM): {note}"
    )


def open_page(
    binary: str, tmp_path: Path, url: str, *mode: str, budget_ms: int = 5000, offline: bool = True
) -> subprocess.CompletedProcess[str]:
    """One headless Chromium run on ``url`` (``mode``: --dump-dom, --screenshot=...), with
    every network load refused unless ``offline`` is False (the dead proxy takes loopback too),
    through the command line and runner ``harness report --screenshot`` uses."""
    profile = tmp_path / f"chromium-profile-{time.monotonic_ns()}"
    command = chromium_command(binary, profile, *mode, url, budget_ms=budget_ms, offline=offline)
    try:
        done = run_chromium(command, timeout=BROWSER_TIMEOUT_S)
    except HarnessError as exc:  # (it overran and was killed)
        pytest.fail(str(exc))
    assert done.returncode == 0, f"chromium exited {done.returncode}: {done.stderr[-2000:]}"
    return done


def check_screenshot(shot: Path, min_bytes: int = 5000) -> None:
    """``shot`` is a PNG with more than a blank page in it; kept under $HARNESS_ARTIFACTS."""
    assert shot.exists(), "chromium wrote no screenshot"
    assert shot.read_bytes()[:8] == PNG_MAGIC
    assert shot.stat().st_size > min_bytes, "the screenshot looks blank"
    artifacts = os.environ.get("HARNESS_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy2(shot, Path(artifacts) / shot.name)
