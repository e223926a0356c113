#!/usr/bin/env bash
# Make a headless-capable `chromium` available for the monitor's browser tests
# (tests/distributed/test_monitor.py). Idempotent: does nothing when `chromium` is on PATH.
# Installs Debian's `chromium` package when running as root with apt-get; otherwise prints how
# to install it and exits 0 (the browser tests then skip, naming the missing browser).
# Exit status: 0 when chromium is available or cannot be installed here, 1 when an install
# was attempted and failed.
set -uo pipefail

if command -v chromium >/dev/null 2>&1; then
  echo "install_chromium: $(command -v chromium) is already installed"
  exit 0
fi

if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "install_chromium: installing Debian's chromium package with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y --no-install-recommends chromium; then
    # A stale or empty package index: refresh it once and retry.
    apt-get update && apt-get install -y --no-install-recommends chromium || {
      echo "install_chromium: apt-get could not install chromium" >&2
      exit 1
    }
  fi
  command -v chromium >/dev/null 2>&1 || {
    echo "install_chromium: apt-get finished but chromium is not on PATH" >&2
    exit 1
  }
  echo "install_chromium: installed $(command -v chromium)"
  exit 0
fi

cat >&2 <<'MSG'
install_chromium: chromium is not installed and this script cannot install it here
(it needs root and apt-get). Install a headless-capable Chromium yourself, e.g.
  Debian/Ubuntu:  sudo apt-get install -y --no-install-recommends chromium
  Fedora:         sudo dnf install -y chromium
  macOS:          brew install --cask chromium
and make sure `chromium` is on PATH. The monitor's browser tests skip until then.
MSG
exit 0
