"""The first-party plugins (plugins/) and competition packs (competitions/) import only the
declared plugin API: the modules in :data:`harness.public.PUBLIC_MODULES` and their public names,
and another plugin's modules only where the importing module declares that plugin in its
``DEPENDS_ON`` (docs/plugins.md, "What a plugin may import").

Every import counts: at module level, inside functions, under ``if TYPE_CHECKING:`` (a type is
API too) and ``importlib.import_module("literal")``. A plugin importing its own modules is fine.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_layout import package_dirs  # same directory: pytest puts it on sys.path

from harness.public import PUBLIC_MODULES
from harness.remote import SupportsCompletions, SupportsReportMetrics

ROOT = Path(__file__).resolve().parents[2]
CORE = "harness"


def core_modules() -> set[str]:
    """Every module of the core package, dotted."""
    found = set()
    for path in (ROOT / CORE).rglob("*.py"):
        parts = [CORE, *path.relative_to(ROOT / CORE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found.add(".".join(parts))
    return found


PLUGINS = sorted(name for name in package_dirs() if name != CORE)
"""The first-party plugin packages (and harness_competitions)."""
EXAMPLE = ("harness_example", ROOT / "tests" / "thirdparty_plugin" / "harness_example")
"""The third-party plugin of docs/plugins.md: held to the same API."""
CORE_MODULES = core_modules()


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    name: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name}: {self.why}"


def exported(module: str) -> frozenset[str] | None:
    """A public core module's ``__all__`` (None when it declares none)."""
    names = getattr(importlib.import_module(module), "__all__", None)
    return None if names is None else frozenset(names)


def depends_on(tree: ast.Module) -> tuple[str, ...]:
    """The module-level ``DEPENDS_ON = ("plugin", ...)`` of a plugin module (empty if none)."""
    for node in tree.body:
        target = (
            node.targets[0]
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            else node.target
            if isinstance(node, ast.AnnAssign) and node.value is not None
            else None
        )
        if isinstance(target, ast.Name) and target.id == "DEPENDS_ON":
            assert node.value is not None
            value = ast.literal_eval(node.value)
            assert isinstance(value, tuple) and all(isinstance(v, str) for v in value), value
            return value
    return ()


def imports(tree: ast.Module) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` for every import in ``tree``: ``import a.b`` gives
    ``("a.b", None)``, ``from a import b`` gives ``("a", "b")``; relative imports (always the
    plugin's own) are left out."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("importlib.import_module", "import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value, None))
    return found


def check_core(line: int, module: str, name: str | None, where: str) -> list[Finding]:
    """Findings for one import from the core: (a) a module not on the public list, (b) a
    name with a leading underscore, (c) a name missing from a public module's ``__all__``."""
    if name is not None and f"{module}.{name}" in CORE_MODULES:  # from harness import numpy_nets
        module, name = f"{module}.{name}", None
    shown = module if name is None else f"{module}.{name}"
    if module not in PUBLIC_MODULES:
        why = f"{module} is private to the core (harness.public.PUBLIC_MODULES lists the public)"
        return [Finding(where, line, shown, why)]
    if name is None or name == "*":
        return []
    names = exported(module)
    if name.startswith("_") and (names is None or name not in names):
        return [Finding(where, line, shown, "a private name (leading underscore)")]
    if names is not None and name not in names:
        why = f"not in {module}.__all__, so private to the core"
        return [Finding(where, line, shown, why)]
    return []


def check_source(source: str, where: str, plugin: str) -> list[Finding]:
    """Every import of one plugin module that leaves the declared API (see the module
    docstring); ``plugin`` is the importing module's top-level package."""
    tree = ast.parse(source)
    declared = depends_on(tree)
    findings = [
        Finding(where, 1, "DEPENDS_ON", f"{other!r} is not a first-party plugin package")
        for other in declared
        if other not in PLUGINS or other == plugin
    ]
    used = set()
    for line, module, name in imports(tree):
        top = module.partition(".")[0]
        if top == CORE:
            findings += check_core(line, module, name, where)
        elif top in PLUGINS and top != plugin:
            used.add(top)
            if top not in declared:
                shown = module if name is None else f"{module}.{name}"
                why = (
                    f"another plugin's module; declare {top!r} in this module's DEPENDS_ON "
                    f"(docs/plugins.md says when) or go through the registry"
                )
                findings.append(Finding(where, line, shown, why))
    findings += [
        Finding(where, 1, "DEPENDS_ON", f"declares {other!r} but imports nothing from it")
        for other in declared
        if other in PLUGINS and other != plugin and other not in used
    ]
    return findings


def plugin_files() -> list[tuple[str, Path]]:
    """``(package, file)`` of every plugin module to check."""
    packages = [*((p, package_dirs()[p]) for p in PLUGINS), EXAMPLE]
    return [(plugin, path) for plugin, where in packages for path in sorted(where.rglob("*.py"))]


def test_plugins_import_only_the_declared_api() -> None:
    files = plugin_files()
    assert len(files) > 50 and {p for p, _ in files} >= {"harness_algos", "harness_example"}
    findings = [
        finding
        for plugin, path in files
        for finding in check_source(
            path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), plugin
        )
    ]
    assert not findings, (
        f"{len(findings)} imports leave the declared plugin API (docs/plugins.md, 'What a "
        f"plugin may import'):\n" + "\n".join(map(str, findings))
    )


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("from harness.cli import plugins_for", "harness.cli.plugins_for"),
        ("def f():\n    from harness.cli import main\n", "harness.cli.main"),
        ("import harness.runtime.run", "harness.runtime.run"),
        ("from harness.runtime import run", "harness.runtime.run"),
        ("from harness.runtime import not_exported", "harness.runtime.not_exported"),
        ("from harness import plugins_for", "harness.plugins_for"),
        ("from harness.errors import _private", "harness.errors._private"),
        ("import importlib\nimportlib.import_module('harness.cli')", "harness.cli"),
        ("from harness_offline.datasets import x", "harness_offline.datasets.x"),
        ("DEPENDS_ON = ('harness_offline',)\n", "DEPENDS_ON"),
        ("DEPENDS_ON = ('harness_nowhere',)\nimport harness_nowhere", "DEPENDS_ON"),
    ],
)
def test_the_checker_flags_what_leaves_the_api(source: str, flagged: str) -> None:
    findings = check_source(source, "mutant.py", "harness_algos")
    assert [f.name for f in findings] == [flagged], findings


@pytest.mark.parametrize(
    "source",
    [
        "from harness import hookimpl, numpy_nets",
        "import harness\nfrom harness.commands import plugins_for",
        "from harness.runtime import train",
        "from harness.remote import SupportsCompletions",
        "from harness_algos.dqn import DQN\nfrom . import offpolicy",
        "DEPENDS_ON = ('harness_offline',)\ndef f():\n    from harness_offline import datasets\n",
    ],
)
def test_the_checker_passes_the_declared_api(source: str) -> None:
    assert check_source(source, "ok.py", "harness_algos") == []


def test_the_public_modules_exist_and_export_what_they_declare() -> None:
    assert list(PUBLIC_MODULES) == sorted(PUBLIC_MODULES)
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        missing = [n for n in getattr(module, "__all__", ()) if not hasattr(module, n)]
        assert not missing, f"{name}.__all__ names what it does not define: {missing}"


def test_the_docs_list_the_same_public_modules() -> None:
    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    start = text.index("What a plugin may import")
    section = text[start : text.find("\n## ", start)]
    listed = re.findall(r"^\| `(harness(?:\.\w+)*)` \|", section, flags=re.MULTILINE)
    assert sorted(listed) == sorted(PUBLIC_MODULES), (
        "docs/plugins.md's table of public modules and harness.public.PUBLIC_MODULES differ: "
        f"only in the docs {sorted(set(listed) - set(PUBLIC_MODULES))}, only in the code "
        f"{sorted(set(PUBLIC_MODULES) - set(listed))}"
    )


def test_the_zmq_client_declares_its_optional_capabilities() -> None:
    """Optional client methods are found by isinstance: a renamed or re-typed method would
    silently drop the ZeroMQ client to the generic, slower Completions."""
    pytest.importorskip("zmq")
    from harness_zmq.client import ZmqClient

    assert issubclass(ZmqClient, SupportsCompletions)
    assert issubclass(ZmqClient, SupportsReportMetrics)
