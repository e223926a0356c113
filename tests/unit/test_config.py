"""Config layering, validation and documentation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.config import (
    RunConfig,
    coerce,
    describe,
    dump_toml,
    field_docs,
    layer,
    parse_override,
    read_config_file,
    resolve,
)
from harness.errors import ConfigError
from harness.plugins import collect_registry, make_plugin_manager
from harness.registry import Registry


@pytest.fixture(scope="module")
def registry() -> Registry:
    return collect_registry(make_plugin_manager())


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_precedence_pack_user_set_env(tmp_path: Path, registry: Registry) -> None:
    pack = write(tmp_path, "pack.toml", '[run]\nseed = 3\nalgo = "ppo"\n[algo]\nn_steps = 16\n')
    user = write(tmp_path, "user.toml", "[algo]\nn_steps = 32\nbatch_size = 128\n")
    raw = layer(pack, [user], ["algo.batch_size=64", "total_steps=500"], environ={})
    cfg = resolve(raw, registry)
    assert cfg.run.seed == 3
    assert cfg.algo.n_steps == 32
    assert cfg.algo.batch_size == 64
    assert cfg.run.total_steps == 500
    assert raw.sources["algo.batch_size"].startswith("--set")
    assert raw.sources["algo.n_steps"] == str(user)


def test_harness_backend_env_var_is_below_files(tmp_path: Path, registry: Registry) -> None:
    raw = layer(None, [], [], environ={"HARNESS_BACKEND": "nope"})
    with pytest.raises(ConfigError, match=r"HARNESS_BACKEND.*Unknown backend 'nope'"):
        resolve(raw, registry)
    pack = write(tmp_path, "p.toml", '[run]\nbackend = "torch"\n')
    assert (
        resolve(layer(pack, environ={"HARNESS_BACKEND": "nope"}), registry).run.backend == "torch"
    )


def test_unknown_key_names_file_key_and_suggestion(tmp_path: Path, registry: Registry) -> None:
    pack = write(tmp_path, "pack.toml", '[run]\nalgo = "ppo"\n[algo]\nlearning_rat = 0.1\n')
    with pytest.raises(ConfigError) as err:
        resolve(layer(pack, environ={}), registry)
    text = str(err.value)
    assert str(pack) in text and "learning_rat" in text and "'learning_rate'" in text


def test_wrong_type_names_expected_type(tmp_path: Path, registry: Registry) -> None:
    pack = write(tmp_path, "pack.toml", '[run]\ntotal_steps = "lots"\n')
    with pytest.raises(ConfigError, match=r"total_steps = 'lots' has the wrong type: expected int"):
        resolve(layer(pack, environ={}), registry)


def test_unknown_section_and_malformed_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown section \[rnu\].*'run'"):
        read_config_file(write(tmp_path, "a.toml", "[rnu]\nx = 1\n"))
    with pytest.raises(ConfigError, match=r"Malformed config file .*b.toml.*line 2"):
        read_config_file(write(tmp_path, "b.toml", "[run]\nseed = = 1\n"))
    with pytest.raises(ConfigError, match=r"Malformed config file .*c.yaml"):
        read_config_file(write(tmp_path, "c.yaml", "run: [unclosed\n"))


def test_yaml_pack(tmp_path: Path, registry: Registry) -> None:
    pack = write(tmp_path, "pack.yaml", "run:\n  algo: dqn\n  seed: 7\nalgo:\n  hidden: [32, 32]\n")
    cfg = resolve(layer(pack, environ={}), registry)
    assert (cfg.run.algo, cfg.run.seed, cfg.algo.hidden) == ("dqn", 7, [32, 32])


def test_switching_algorithm_drops_options_meant_for_another(
    tmp_path: Path, registry: Registry
) -> None:
    pack = write(tmp_path, "pack.toml", '[run]\nalgo = "ppo"\n[algo]\nn_epochs = 3\n')
    cfg = resolve(layer(pack, [], ["algo=dqn", "algo.batch_size=16"], environ={}), registry)
    assert cfg.run.algo == "dqn" and cfg.algo.batch_size == 16


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("seed=3", ("run", "seed", 3)),
        ("algo.learning_rate=3e-4", ("algo", "learning_rate", 3e-4)),
        ("algo.hidden=[32, 32]", ("algo", "hidden", [32, 32])),
        ("run.env=Pendulum-v1", ("run", "env", "Pendulum-v1")),
        ("backend.device='cpu'", ("backend", "device", "cpu")),
        ("progress=false", ("run", "progress", False)),
    ],
)
def test_parse_override(text: str, expected: tuple[str, str, object]) -> None:
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["seed", "bogus.seed=1", "=3"])
def test_bad_override(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_override(text)


def test_coerce() -> None:
    assert coerce(1, float) == 1.0 and isinstance(coerce(1, float), float)
    assert coerce(None, float | None) is None
    assert coerce([1, 2], list[int]) == [1, 2]
    for value, tp in [(True, int), ("1", int), (1.5, int), (1, str), ("x", list[int]), (1, bool)]:
        with pytest.raises((TypeError, ValueError)):
            coerce(value, tp)


def test_every_config_field_is_documented(registry: Registry) -> None:
    classes = [RunConfig]
    classes += [s.config_cls for _, s in registry.algorithms.items()]
    classes += [s.config_cls for _, s in registry.backends.items() if s.config_cls]
    classes += [s.config_cls for _, s in registry.envs.items() if s.config_cls]
    for cls in classes:
        docs = field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"{cls.__name__} fields without a docstring: {missing}"
    rows = {key: doc for key, _, doc in describe(RunConfig)}
    assert "Environment steps" in rows["total_steps"]


def test_dump_toml_round_trips(registry: Registry, tmp_path: Path) -> None:
    pack = write(tmp_path, "pack.toml", '[run]\nalgo = "dqn"\nstop_at_return = 100.0\n')
    cfg = resolve(layer(pack, environ={}), registry)
    again = resolve(
        layer(write(tmp_path, "again.toml", dump_toml(cfg.to_dict())), environ={}), registry
    )
    assert again.to_dict() == cfg.to_dict()


PACKS = Path(__file__).resolve().parents[2] / "competitions"
PACK_FILES = sorted(
    [p] if p.name == "pack.toml" else [p.parent / "pack.toml", p] for p in PACKS.glob("*/*.toml")
)


@pytest.mark.parametrize(
    "files",
    PACK_FILES,
    ids=["+".join(f"{f.parent.name}/{f.stem}" for f in fs) for fs in PACK_FILES],
)
def test_every_pack_and_recipe_round_trips_through_the_run_directorys_config_toml(
    registry: Registry, tmp_path: Path, files: list[Path]
) -> None:
    """``config.toml`` in a run directory is a runnable pack file (``harness run RUN/config.toml``,
    ``--resume``): every pack with each of its recipes, written out and read back, resolves to
    the same config, nested tables included (a MyoSuite env's kwargs.weighted_reward_keys,
    curriculum stages, closeness entries; once written as Python reprs in strings, so a resumed
    Die run handed MyoSuite a string for its reward weights)."""
    cfg = resolve(layer(files[0], files[1:], [], environ={}), registry)
    text = dump_toml(cfg.to_dict())
    again = resolve(layer(write(tmp_path, "again.toml", text), environ={}), registry)
    assert again.to_dict() == cfg.to_dict()


def test_dump_toml_writes_nested_tables_and_quotes_keys_that_are_not_bare() -> None:
    import tomllib

    data = {
        "env": {
            "kwargs": {"weighted_reward_keys": {"pos_dist": 100.0, "solved": 10.0}},
            "progress": {"obj_pos[2]": 50.0},
            "curriculum": [{"kwargs": {"goal_rot": [-0.785, 0.785]}}, {"kwargs": {}}],
            "name": 'a "quoted" value',
        }
    }
    assert tomllib.loads(dump_toml(data)) == data


def test_did_you_mean_knows_spellings_and_abbreviations() -> None:
    from harness.errors import did_you_mean

    keys = ["learning_rate", "gae_lambda", "gamma", "batch_size", "buffer_size", "clip_obs"]
    assert did_you_mean("lr", keys) == " Did you mean 'learning_rate'?"
    assert did_you_mean("gama", keys) == " Did you mean 'gamma'?"
    assert "'batch_size'" in did_you_mean("bs", keys)
    assert did_you_mean("zzz", keys).startswith(" Known: batch_size,")
