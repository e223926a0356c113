"""The first-party algorithms' configs (plugins/harness_algos/) as users and files see them.

Checkpoints and pack files depend on every ``[algo]`` key: its name, type, default, place in
the field order, its ``--help`` text and what it refuses. ``algo_configs.json`` beside this file
pins all of them, as the code stood before the configs were flattened (issue 27); a deliberate
change regenerates it with ``python tests/unit/test_algo_configs.py --write``.

The shape is pinned too (CleanRL's rule, ../shared/STYLE.md): each algorithm's config is one
dataclass in the algorithm's own module, every field written there, with at most one
harness_algos base class.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.config import describe
from harness.plugins import collect_registry, make_plugin_manager

SNAPSHOT = Path(__file__).with_name("algo_configs.json")


def algorithms() -> dict[str, Any]:
    """Algorithm name -> its registration record, from the first-party algos plugin alone."""
    registry = collect_registry(make_plugin_manager(autoload=False, load=["algos"]))
    return dict(registry.algorithms.items())


# ------------------------------------------------------------------------------------------
# What the snapshot holds


def outcome(cls: type[Any], **overrides: Any) -> str:
    """``"ok"``, or the error a config built with ``overrides`` raises."""
    try:
        cls(**overrides)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def probe_values(default: Any) -> list[Any]:
    """Values to try on a field, by its default: the edges the configs validate (negative,
    zero, one, past one) and unknown names. Booleans are not validated."""
    if isinstance(default, bool):
        return []
    if isinstance(default, int):
        return [-1, 0, 1, 2]
    if isinstance(default, float) or default is None:
        return [-1.0, 0.0, 0.5, 1.0, 1.5]
    if isinstance(default, str):
        return ["", "bogus"]
    return [[]]


def validation(cls: type[Any]) -> dict[str, Any]:
    """What the config refuses: each probe value refused on its own, with its error (the other
    probes are accepted); the error of two fields refused with different errors, one value
    each (which check comes first); and the outcome of any other pair of probes that does not
    follow from the two single outcomes (accepted alone, refused together)."""
    probes = []
    for f in dataclasses.fields(cls):
        factory = f.default_factory
        default = f.default if factory is dataclasses.MISSING else factory()
        probes += [(f.name, value) for value in probe_values(default)]
    single = {(name, repr(value)): outcome(cls, **{name: value}) for name, value in probes}
    first_refused: dict[str, Any] = {}
    for name, value in probes:
        if single[name, repr(value)] != "ok":
            first_refused.setdefault(name, value)
    pairs: dict[str, str] = {}
    for (a, va), (b, vb) in itertools.combinations(probes, 2):
        alone = {single[a, repr(va)], single[b, repr(vb)]} - {"ok"}
        if a == b or (len(alone) > 1 and (va, vb) != (first_refused[a], first_refused[b])):
            continue
        both = outcome(cls, **{a: va, b: vb})
        expected = alone if alone else {"ok"}
        if len(alone) > 1 or both not in expected:
            pairs[f"{a}={va!r}, {b}={vb!r}"] = both
    return {
        "default": outcome(cls),
        "single": {f"{name}={value}": out for (name, value), out in single.items() if out != "ok"},
        "pairs": pairs,
    }


def fields(cls: type[Any]) -> list[list[str]]:
    """``[name, type, default]`` of every field, in dataclass order."""
    return [
        [name, str(f.type), default]
        for f, (name, default, _) in zip(dataclasses.fields(cls), describe(cls), strict=True)
    ]


def current(spec: Any) -> dict[str, Any]:
    cls = spec.config_cls
    return {
        "config": cls.__name__,
        "fields": fields(cls),
        "docs": [list(row) for row in describe(cls, "algo.")],
        "validation": validation(cls),
    }


def snapshot() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    return loaded


# ------------------------------------------------------------------------------------------
# The tests

NAMES = sorted(algorithms())


def test_every_algorithm_is_pinned() -> None:
    assert sorted(snapshot()) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_fields_and_docs_are_as_pinned(name: str) -> None:
    """Names, types, defaults and order of the fields, and their --help docs."""
    now, pinned = current(algorithms()[name]), snapshot()[name]
    assert now["config"] == pinned["config"]
    assert now["fields"] == pinned["fields"]
    assert now["docs"] == pinned["docs"]


@pytest.mark.parametrize("name", NAMES)
def test_validation_is_as_pinned(name: str) -> None:
    """The same values are refused with the same errors, in the same order."""
    now, pinned = current(algorithms()[name])["validation"], snapshot()[name]["validation"]
    assert now["default"] == pinned["default"] == "ok"
    assert now["single"] == pinned["single"]
    assert now["pairs"] == pinned["pairs"]


@pytest.mark.parametrize("name", NAMES)
def test_config_is_written_whole_in_the_algorithm_module(name: str) -> None:
    """One dataclass in the algorithm's module declares every field (no diamond of bases to
    follow); at most one harness_algos base (a marker such as OfflineConfig)."""
    spec = algorithms()[name]
    cls = spec.config_cls
    assert cls.__module__ == spec.make_agent.__module__
    bases = [k for k in cls.__mro__[1:] if k.__module__.startswith("harness_algos")]
    assert len(bases) <= 1, bases
    for f in dataclasses.fields(cls):
        owner = next(k for k in cls.__mro__ if f.name in inspect.get_annotations(k))
        assert owner is cls, f"{cls.__name__}.{f.name} is declared in {owner.__qualname__}"
    assert not any(dataclasses.is_dataclass(k) for k in bases), bases


def test_run_help_lists_an_algorithms_fields(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    section = out.split("algorithm 'sac' options")[1].split("\n\n")[0]
    words = " ".join(section.split())  # the docs are wrapped to the terminal
    for key, default, doc in describe(algorithms()["sac"].config_cls, "algo."):
        assert f"  {key} = {default}\n" in section
        assert " ".join(doc.split()) in words


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {sys.argv[0]} --write  (regenerates {SNAPSHOT.name})")
    data = {name: current(spec) for name, spec in sorted(algorithms().items())}
    SNAPSHOT.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {SNAPSHOT}")
