"""setup.cfg lists every package of the distribution: a directory with an ``__init__.py``
under a top-level package that ``packages`` leaves out is built as "package data", with a
screen of setuptools warnings per directory on every ``pip install -e .`` (and, for Python
subpackages, would be missing from a wheel)."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_directory_is_listed() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    found = set()
    for line in cfg["options"]["package_dir"].strip().splitlines():
        name, _, where = (part.strip() for part in line.partition("="))
        top = ROOT / where
        for init in top.rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                parts = init.parent.relative_to(top).parts
                found.add(".".join([name, *parts]))
    missing = sorted(found - listed)
    assert not missing, f"setup.cfg [options] packages lacks {missing}"
