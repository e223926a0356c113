"""Names that moved out of ``harness.runtime.run`` (when the runtime was split by job) and
``harness.runtime.farm`` (the memory check, to ``harness.runtime.build``) still resolve at their
old paths for one release, each with a DeprecationWarning naming the new import; the repository
itself imports none of them from the old paths."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PUBLIC = ("EnvStepper", "Episode", "EvalResult", "Run", "RunResult", "build_run", "load_agent")
"""What ``harness.runtime.run`` gave before the split (its ``__all__`` then, and ``Run``) that
``harness.runtime`` exports."""

OLD_PATHS = [
    *(("harness.runtime.run", name, "harness.runtime") for name in PUBLIC),
    ("harness.runtime.run", "make_agent", "harness.runtime"),
    ("harness.runtime.run", "make_envs", "harness.runtime"),
    ("harness.runtime.run", "EPISODE_METRICS", "harness.runtime.stepper"),
    ("harness.runtime.run", "episode_metrics", "harness.runtime.stepper"),
    ("harness.runtime.run", "check_compatible", "harness.runtime.build"),
    ("harness.runtime.farm", "ACTOR_MEMORY_MB", "harness.runtime.build"),
    ("harness.runtime.farm", "available_memory_mb", "harness.runtime.build"),
    ("harness.runtime.farm", "check_actor_capacity", "harness.runtime.build"),
]


@pytest.mark.parametrize(
    ("old", "name", "new"), OLD_PATHS, ids=[f"{o}.{n}" for o, n, _ in OLD_PATHS]
)
def test_an_old_path_warns_and_gives_the_new_object(old: str, name: str, new: str) -> None:
    module = importlib.import_module(old)
    with pytest.warns(
        DeprecationWarning,
        match=rf"{re.escape(old)}\.{name} is deprecated: "
        rf"import {name} from {re.escape(new)}$",
    ):
        got = getattr(module, name)
    assert got is getattr(importlib.import_module(new), name)


def test_from_import_of_an_old_path_warns_in_a_fresh_process() -> None:
    """``from harness.runtime.run import load_agent`` (what code written before the split
    does) works and warns, in a process of its own (nothing imported before it)."""
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n"
        "    from harness.runtime.run import load_agent\n"
        "except DeprecationWarning as w:\n"
        "    print(w)\n"
        "from harness.runtime.run import evaluate, train  # (defined there: no warning)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == (
        "harness.runtime.run.load_agent is deprecated: import load_agent from harness.runtime"
    ), out.stderr


def test_the_repository_imports_no_moved_name_from_its_old_path() -> None:
    moved: dict[str, set[str]] = {}
    for old, name, _ in OLD_PATHS:
        moved.setdefault(old, set()).add(name)
    pattern = re.compile(r"from (harness\.runtime\.(?:run|farm)) import \(?([\w, \n]+)\)?")
    found = []
    for folder in ("harness", "plugins", "tests", "tools", "competitions"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == Path(__file__).resolve():  # (this file spells the old paths out)
                continue
            text = path.read_text(encoding="utf-8")
            for module, names in pattern.findall(text):
                bad = {n.strip() for n in names.split(",")} & moved[module]
                found += [f"{path.relative_to(ROOT)}: {module}.{n}" for n in sorted(bad)]
    assert not found, "moved names imported from their old paths:\n" + "\n".join(found)
