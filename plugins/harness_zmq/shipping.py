"""Shipping local code to actors, both halves: the client packs the sources a class needs, the
actor installs them before it unpickles the class.

**Packing (the client).** Classes from ``__main__`` travel by value (cloudpickle); so do
classes from local modules (not installed: files next to the script, in the cwd or on a path
entry outside the interpreter's prefixes), whose top-level modules are registered with
``cloudpickle.register_pickle_by_value``. The source files of every local module or package
reachable from the class's module (its globals, recursively) are shipped too
(:func:`shipped_sources`), in the ``INIT`` payload (:class:`InitPayload`).

**Installing (the actor).** The ``INIT`` payload unpickles as ``(cls, args, kwargs,
shipped_sources)``, and its first step is :func:`install_shipped`: the sources are written
under the actor's own directory, which goes first on ``sys.path``, before the class or its
arguments are unpickled (so they may refer to modules that only exist as shipped sources).
Module names and file paths are checked: nothing is written outside that directory.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import re
import site
import sys
import sysconfig
import tempfile
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cloudpickle

from harness.errors import HarnessError

log = logging.getLogger(__name__)

__all__ = [
    "MAX_SHIPPED_BYTES",
    "InitPayload",
    "install_shipped",
    "set_source_dir",
    "shipped_sources",
]

MAX_SHIPPED_BYTES = 20 * 2**20
"""Local sources beyond this many bytes in all are not shipped (a warning says so)."""


# ------------------------------------------------------------------------------------------
# the client: the sources a class needs


def shipped_sources(cls: type[Any]) -> tuple[dict[str, Any], list[str]]:
    """The sources of the local modules ``cls`` needs, and the local top-level modules
    registered for pickling by value (see the module docstring).

    Returns ``({top-level name: source text | {relative path: source text}}, [names])``."""
    start = sys.modules.get(cls.__module__)
    roots: list[types.ModuleType] = [] if start is None else [start]
    for base in getattr(cls, "__mro__", ())[1:]:
        module = sys.modules.get(getattr(base, "__module__", "") or "")
        if module is not None:
            roots.append(module)
    local: dict[str, types.ModuleType] = {}
    seen: set[str] = set()
    todo = [m for m in roots if m.__name__ == "__main__" or _is_local(m)]
    while todo:
        module = todo.pop()
        if module.__name__ in seen:
            continue
        seen.add(module.__name__)
        if module.__name__ != "__main__":
            top = module.__name__.partition(".")[0]
            if top not in local and top in sys.modules:
                local[top] = sys.modules[top]
                todo.append(local[top])
        for value in list(vars(module).values()):
            if isinstance(value, types.ModuleType):
                candidate: types.ModuleType | None = value
            else:
                name = getattr(value, "__module__", None) if _is_code(value) else None
                candidate = sys.modules.get(name) if isinstance(name, str) else None
            if (
                candidate is not None
                and candidate.__name__ not in seen
                and candidate.__name__ != "__main__"
                and _is_local(candidate)
            ):
                todo.append(candidate)
    sources: dict[str, Any] = {}
    size = 0
    for top, module in sorted(local.items()):
        with contextlib.suppress(Exception):
            cloudpickle.register_pickle_by_value(module)
        files = _module_files(module)
        if files is None:
            continue
        size += sum(len(text) for text in files.values())
        if size > MAX_SHIPPED_BYTES:
            log.warning("not shipping %s: local sources over %d MB", top, MAX_SHIPPED_BYTES >> 20)
            break
        if getattr(module, "__path__", None) is None:
            sources[top] = next(iter(files.values()))
        else:
            sources[top] = files
    return sources, sorted(local)


def _is_code(value: Any) -> bool:
    return isinstance(value, type | types.FunctionType | types.BuiltinFunctionType)


def _module_files(module: types.ModuleType) -> dict[str, str] | None:
    name = module.__name__
    paths = getattr(module, "__path__", None)
    if paths is None:  # a plain module
        file = getattr(module, "__file__", None)
        if not file or not file.endswith(".py"):
            return None
        with contextlib.suppress(OSError, UnicodeDecodeError):
            return {f"{name}.py": Path(file).read_text(encoding="utf-8")}
        return None
    files: dict[str, str] = {}
    for entry in list(paths):
        root = Path(entry)
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            with contextlib.suppress(OSError, UnicodeDecodeError):
                files.setdefault(str(Path(name, rel)), path.read_text(encoding="utf-8"))
    return files


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(Exception):
            roots.add(sysconfig.get_paths()[key])
    with contextlib.suppress(Exception):
        roots.update(site.getsitepackages())
    with contextlib.suppress(Exception):
        roots.add(site.getusersitepackages())
    return tuple(sorted({os.path.realpath(r) + os.sep for r in roots if r}))


@functools.cache
def _distributions() -> frozenset[str]:
    import importlib.metadata

    try:
        return frozenset(importlib.metadata.packages_distributions())
    except Exception:
        return frozenset()


def _is_local(module: types.ModuleType) -> bool:
    """A module that exists only as files here: not stdlib, not installed (also editable)."""
    name = module.__name__
    if name == "__main__":
        return False
    top = name.partition(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return False
    if top in _distributions():
        return False
    file = getattr(module, "__file__", None)
    if not file:
        paths = list(getattr(module, "__path__", None) or [])
        if not paths:
            return False
        file = paths[0]
    real = os.path.realpath(file)
    return not any(real.startswith(root) for root in _installed_roots())


# ------------------------------------------------------------------------------------------
# the actor: the INIT payload installs sources before it unpickles the class

_SOURCE_DIR: str | None = None  # where shipped sources go (the actor's temporary directory)


def set_source_dir(directory: str) -> None:
    """Where :func:`install_shipped` writes in this process (an actor: its own directory)."""
    global _SOURCE_DIR
    _SOURCE_DIR = directory


_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def install_shipped(sources: Mapping[str, Any]) -> Mapping[str, Any]:
    """Write shipped sources under the actor's directory and put it first on ``sys.path``.

    ``sources`` maps a top-level module name to its source text (a module) or to a mapping
    ``relative path -> source text`` (the files of a package, paths starting with its name)."""
    if not sources:
        return sources
    root = _SOURCE_DIR
    if root is None:  # not in an actor (tests): a directory of our own
        root = _SOURCE_DIR_FALLBACK.setdefault("dir", tempfile.mkdtemp(prefix="harness-src-"))
    base = Path(root, "shipped")
    for name, source in sources.items():
        if not _MODULE_NAME.match(str(name)):
            raise HarnessError(f"refusing shipped module with the name {name!r}")
        if isinstance(source, str):
            files = {f"{name}.py": source}
        elif isinstance(source, Mapping):
            files = dict(source)
        else:
            raise HarnessError(f"shipped module {name!r}: expected text or a mapping of files")
        for rel, text in files.items():
            path = Path(rel)
            if (
                path.is_absolute()
                or ".." in path.parts
                or path.parts[0] != (name if isinstance(source, Mapping) else f"{name}.py")
            ):
                raise HarnessError(f"refusing shipped file {rel!r} of module {name!r}")
            target = base / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    importlib.invalidate_caches()
    return sources


_SOURCE_DIR_FALLBACK: dict[str, str] = {}


def _init_tuple(sources: Any, cls: Any, args: Any, kwargs: Any) -> tuple[Any, Any, Any, Any]:
    return (cls, args, kwargs, sources)


class _Install:
    """Unpickles as ``install_shipped(sources)``: placed first in the INIT pickle."""

    __slots__ = ("sources",)

    def __init__(self, sources: Mapping[str, Any]) -> None:
        self.sources = sources

    def __reduce__(self) -> tuple[Any, ...]:
        return (install_shipped, (dict(self.sources),))


class InitPayload:
    """The INIT payload. Unpickles as the tuple ``(cls, args, kwargs, shipped_sources)``,
    installing the shipped sources before the class, its arguments or anything else in it
    is unpickled (so they may refer to modules that only exist as shipped sources)."""

    __slots__ = ("args", "cls", "kwargs", "sources")

    def __init__(
        self, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any], sources: Mapping[str, Any]
    ) -> None:
        self.cls, self.args, self.kwargs, self.sources = cls, args, kwargs, sources

    def __reduce__(self) -> tuple[Any, ...]:
        return (_init_tuple, (_Install(self.sources), self.cls, self.args, self.kwargs))
