"""The API reference (docs/api) builds with warnings as errors, and every public name a plugin
may touch is on its pages.

autodoc runs without ``undoc-members``: a public function, method or record field with no
docstring is left off the pages, and the inventory check below names it. ``nitpicky`` makes a
signature that names an undocumented harness type a build warning, hence an error here.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import logging
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api"
MODULES = [
    "harness.api",
    "harness.policy",
    "harness.registry",
    "harness.hookspecs",
    "harness.errors",
    "harness.remote",
    "harness.commands",
    "harness.sequences",
    "harness.numpy_nets",
    "harness.curriculum",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    """(exit status, warnings, output directory) of one fresh ``sphinx-build -W`` run."""
    build = pytest.importorskip("sphinx.cmd.build", reason="sphinx is in the dev extra")
    root = tmp_path_factory.mktemp("docs-api")
    out, warnings = root / "html", root / "warnings.txt"
    args = ["-W", "--keep-going", "-E", "-q", "-b", "html", "-d", str(root / "doctrees")]
    status = build.build_main([*args, "-w", str(warnings), str(DOCS), str(out)])
    text = warnings.read_text(encoding="utf-8") if warnings.exists() else ""
    return status, text, out


def inventory(path: Path) -> dict[str, str]:
    """``{name: domain:role}`` from a Sphinx objects.inv (version 2: four header lines, then
    zlib-compressed ``name domain:role priority uri display-name`` lines)."""
    raw = path.read_bytes()
    header_end = 0
    for _ in range(4):
        header_end = raw.index(b"\n", header_end) + 1
    assert raw.startswith(b"# Sphinx inventory version 2"), raw[:40]
    entries = {}
    for line in zlib.decompress(raw[header_end:]).decode("utf-8").splitlines():
        name, role = line.split(" ", 2)[:2]
        entries[name] = role
    return entries


def top_level_names(module: ModuleType) -> list[str]:
    """``__all__``, or else what the module's own source defines at the top level (classes,
    functions, assigned names; imports excluded), minus private names."""
    names = getattr(module, "__all__", None)
    if names is None:
        tree = ast.parse(inspect.getsource(module))
        names = []
        for node in tree.body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef):
                names.append(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names += [t.id for t in targets if isinstance(t, ast.Name)]
    # type variables and the module's logger are not API
    hidden = (TypeVar, logging.Logger)
    return [
        n for n in names if not n.startswith("_") and not isinstance(getattr(module, n), hidden)
    ]


def class_members(cls: type[Any]) -> list[str]:
    """Public attributes and methods the class itself defines (annotated fields included),
    not those it inherits."""
    own = set(vars(cls)) | set(vars(cls).get("__annotations__", {}))
    own |= set(getattr(cls, "_fields", ()))  # a NamedTuple's fields
    return sorted(n for n in own if not n.startswith("_"))


def public_names(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    names = []
    for name in top_level_names(module):
        names.append(f"{module_name}.{name}")
        obj = getattr(module, name)
        if inspect.isclass(obj) and obj.__module__ == module_name:
            names += [f"{module_name}.{name}.{m}" for m in class_members(obj)]
    return names


def test_the_reference_builds_without_warnings(built: tuple[int, str, Path]) -> None:
    status, warnings, _ = built
    assert status == 0 and not warnings.strip(), (
        f"sphinx-build -W docs/api failed (exit {status}); fix the docstrings it names:\n{warnings}"
    )


def test_the_public_name_list_is_not_vacuous() -> None:
    names = set(public_names("harness.api")) | set(public_names("harness.registry"))
    expected = {
        "harness.api.Agent.sample",
        "harness.api.Backend.inference",
        "harness.api.Transition.next_obs",
        "harness.registry.AlgorithmSpec.make_agent",
        "harness.registry.CompetitionSpec.pack_file",
        "harness.registry.Registry.env_for",
    }
    assert expected <= names, expected - names
    assert not any(".np" in n or ".abc" in n or ".Any" in n for n in names), sorted(names)


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_is_documented(built: tuple[int, str, Path], module_name: str) -> None:
    _, _, out = built
    documented = inventory(out / "objects.inv")
    missing = [n for n in public_names(module_name) if n not in documented]
    assert not missing, (
        f"{len(missing)} public names of {module_name} are missing from the API reference "
        f"(docs/api): {', '.join(missing)}. Give each a docstring (a field: a string literal "
        f"right under it); autodoc leaves undocumented names out."
    )


def test_the_hand_written_run_attributes_still_exist(built: tuple[int, str, Path]) -> None:
    """docs/api/hookspecs.rst describes the plain fields of Run by hand (runtime/state.py
    gives them no docstrings): each must still be an attribute of Run."""
    from harness.runtime import Run

    _, _, out = built
    prefix = "harness.runtime.Run."
    documented = [
        n.removeprefix(prefix) for n in inventory(out / "objects.inv") if n.startswith(prefix)
    ]
    attributes = {f.name for f in dataclasses.fields(Run)} | set(vars(Run))
    assert {"step", "config", "update_env"} <= set(documented), documented
    stale = [n for n in documented if n not in attributes]
    assert not stale, f"docs/api/hookspecs.rst documents Run attributes that are gone: {stale}"


def test_the_reference_names_public_paths_and_the_old_one_warns(
    built: tuple[int, str, Path],
) -> None:
    """The pages document ``harness.runtime.Run`` and ``harness.runtime.env_info`` (what a
    plugin may import: harness.public), not the private modules behind them; the private
    ``harness.runtime.run.Run`` the pages used to give still works, with a warning."""
    import harness.runtime
    import harness.runtime.run

    _, _, out = built
    documented = inventory(out / "objects.inv")
    assert {"harness.runtime.Run", "harness.runtime.env_info"} <= set(documented)
    # (harness.runtime.state.Run may be listed: Sphinx's canonical alias of the class)
    private = ("harness.runtime.run.", "harness.runtime.spaces.")
    assert not [n for n in documented if n.startswith(private)]
    with pytest.warns(DeprecationWarning, match=r"import Run from harness\.runtime"):
        old = harness.runtime.run.Run
    assert old is harness.runtime.Run
