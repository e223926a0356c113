"""The shape of the source tree: no import cycle among harness's and the first-party plugins'
modules (imports inside functions count: a deferred import hides a cycle, it does not remove
it; imports under ``if TYPE_CHECKING:`` do not run and do not count), and no source file so long
that it is usually two modules.
"""

from __future__ import annotations

import ast
import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 720
"""~700 lines: past that a module usually does two jobs (../shared/STYLE.md)."""


def package_dirs() -> dict[str, Path]:
    """Top-level package -> its directory, from setup.cfg's package_dir."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    dirs = {}
    for line in cfg["options"]["package_dir"].strip().splitlines():
        name, _, where = (part.strip() for part in line.partition("="))
        dirs[name] = ROOT / where
    return dirs


def modules() -> dict[str, Path]:
    """Every module of the distribution, dotted name -> file."""
    found = {}
    for package, directory in package_dirs().items():
        for path in directory.rglob("*.py"):
            parts = [package, *path.relative_to(directory).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules ``path`` imports at run time: ``from a.b import c`` names ``a.b.c``
    when that is a module, else ``a.b`` (not ``a``: a parent package is run first, but the
    import asks for the module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in known:
                    out.add(full)
                elif node.module in known:
                    out.add(node.module)
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_deferred_imports_included() -> None:
    known = modules()
    edges = {name: imports_of(path, known) for name, path in known.items()}
    loops = cycles(edges)
    detail = [
        f"{' <-> '.join(loop)}: "
        + "; ".join(f"{m} imports {sorted(edges[m] & set(loop))}" for m in loop)
        for loop in loops
    ]
    assert not loops, "import cycles:\n" + "\n".join(detail)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_source_file_is_two_modules_long() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in modules().values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"files over {MAX_LINES} lines (split them by job): {long}"
