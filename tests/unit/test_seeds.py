"""harness.seeds: every seed of a run from named SeedSequence streams, independent of each
other, and the only place in the harness that derives one."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest

from harness.seeds import SEED_BITS, STREAMS, Seeds

ROOT = Path(__file__).resolve().parents[2]


def test_a_stream_repeats_itself_and_differs_from_every_other_stream() -> None:
    seeds = Seeds(1)
    assert seeds.seed("envs", 4000) == Seeds(1).seed("envs", 4000)
    draws = {
        (name, keys): seeds.seed(name, *keys)
        for name in STREAMS
        for keys in [(), (0,), (1,), (0, 0), (0, 1), (1, 0), (3, 2, 4000)]
    }
    assert len(set(draws.values())) == len(draws)  # 70 streams, no two alike
    assert all(0 <= s < 2**SEED_BITS for s in draws.values())


def test_neighbouring_seeds_and_steps_do_not_overlap() -> None:
    # the sums they replace collided: seed 1 at step 1 reset the envs like seed 2 at step 0,
    # and actor i of one farm like actor i + 1 of another (seed * 100_003 + step + 7919 * i)
    pairs = [((1, 1), (2, 0)), ((0, 7919), (0, 0)), ((5, 0), (4, 1))]
    for (seed_a, step_a), (seed_b, step_b) in pairs:
        assert Seeds(seed_a).seed("envs", step_a) != Seeds(seed_b).seed("envs", step_b)
    roots = {Seeds(s).seed("actor", i, r, 0) for s in range(4) for i in range(8) for r in range(3)}
    assert len(roots) == 4 * 8 * 3


def test_streams_are_statistically_independent() -> None:
    """Draws of two streams of one seed (and of one stream of two neighbouring seeds) are
    uncorrelated: |r| below 5 standard errors over 20,000 normals, for every pair."""
    n = 20_000
    sources = [(1, name, ()) for name in STREAMS] + [(2, "envs", ()), (1, "envs", (1,))]
    samples = [Seeds(s).generator(name, *keys).standard_normal(n) for s, name, keys in sources]
    for a, b in itertools.combinations(samples, 2):
        r = float(np.corrcoef(a, b)[0, 1])
        assert abs(r) < 5 / np.sqrt(n), r


def test_bad_streams_and_keys_are_refused() -> None:
    with pytest.raises(KeyError, match="no random stream 'env'"):
        Seeds(1).seed("env")
    with pytest.raises(ValueError, match="0 or more"):
        Seeds(-1)
    with pytest.raises(ValueError, match="0 or more"):
        Seeds(1).seed("envs", -3)


def _derives_a_seed(node: ast.AST) -> bool:
    """``default_rng([...])``/``SeedSequence(...)`` over a list, or arithmetic on a name
    containing 'seed' (``seed + step``, ``cfg.seed * 100_003``)."""
    if isinstance(node, ast.Call):
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        if name in ("default_rng", "SeedSequence") and node.args:
            return isinstance(node.args[0], (ast.List, ast.Tuple, ast.BinOp))
    if isinstance(node, ast.BinOp):
        for side in (node.left, node.right):
            text = ast.unparse(side)
            if "seed" in text.lower() and "seeds" not in text.lower():
                return True
    return False


def test_nothing_else_in_the_runtime_derives_a_seed() -> None:
    """The run's seeds come from harness.seeds alone (the test that the formulas it replaced,
    e.g. ``10_000 + seed + step``, do not come back)."""
    found = []
    for path in [*(ROOT / "harness").rglob("*.py"), ROOT / "competitions" / "baselines.py"]:
        if path.name == "seeds.py" or "testing" in path.parts:
            continue  # (check_algorithm's seed + k: distinct agents of one test, not a run)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if _derives_a_seed(node):
                found.append(
                    f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}: {ast.unparse(node)}"
                )
    assert not found, "\n".join(found)
