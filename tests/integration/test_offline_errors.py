"""Bad input to the offline side, through the real CLI (in process): exit code 2, one paragraph
naming the file, the key or the spaces, and how to fix it; nothing trained."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.api import EnvInfo, SpaceInfo
from harness.cli import main

pytest.importorskip(
    "minari", reason="the offline tests need minari (pip install 'harness[offline]')"
)

from harness_offline.testing import random_dataset

ROOT = Path(__file__).resolve().parents[2]
PENDULUM = ROOT / "competitions" / "pendulum"
CARTPOLE_INFO = EnvInfo(
    "CartPole-v1",
    SpaceInfo(
        "box",
        (4,),
        "float32",
        low=(-4.8, -3.4e38, -0.42, -3.4e38),
        high=(4.8, 3.4e38, 0.42, 3.4e38),
    ),
    SpaceInfo("discrete", (), "int64", n=2),
    num_envs=1,
)
PENDULUM_INFO = EnvInfo(
    "Pendulum-v1",
    SpaceInfo("box", (3,), "float32", low=(-1.0, -1.0, -8.0), high=(1.0, 1.0, 8.0)),
    SpaceInfo("box", (1,), "float32", low=(-2.0,), high=(2.0,)),
    num_envs=1,
)


def run_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``harness ARGS``: must exit 2 without a traceback; returns stderr."""
    code = main(list(args))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err


def offline_run(tmp_path: Path, *overrides: str) -> list[str]:
    return [
        "run",
        str(PENDULUM),
        "--set",
        "algo=cql",
        "--set",
        "trackers=['csv']",
        "--out",
        str(tmp_path / "runs"),
        "--no-progress",
        *(x for o in overrides for x in ("--set", o)),
    ]


@pytest.fixture(scope="module")
def pendulum_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_dataset(tmp_path_factory.mktemp("data") / "pendulum-noise-v0", PENDULUM_INFO)


def test_dataset_of_another_env_is_refused_with_both_spaces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = random_dataset(tmp_path / "cartpole-random-v0", CARTPOLE_INFO)
    err = run_error(capsys, *offline_run(tmp_path, f"algo.dataset='{dataset}'"))
    assert f"Dataset {dataset} does not fit env 'Pendulum-v1'" in err
    assert "observation and action spaces differ" in err
    assert "dataset observation space: Box([" in err and "(4,), float32)" in err
    assert "env observation space:     Box([-1. -1. -8.], [1. 1. 8.], (3,), float32)" in err
    assert "dataset action space: Discrete(2)" in err
    assert "env action space:     Box([-2.], [2.], (1,), float32)" in err
    assert "harness collect" in err


def test_dataset_with_other_action_bounds_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Same shapes, other action box: scaling actions into [-1, 1] would be wrong."""
    wide = SpaceInfo("box", (1,), "float32", low=(-4.0,), high=(4.0,))
    info = EnvInfo("Pendulum-v1", PENDULUM_INFO.observation, wide, num_envs=1)
    dataset = random_dataset(tmp_path / "wide-v0", info)
    err = run_error(capsys, *offline_run(tmp_path, f"algo.dataset='{dataset}'"))
    assert "its action space differs" in err
    assert "dataset action space: Box(-4.0, 4.0, (1,), float32)" in err


def test_missing_dataset_names_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere" / "pendulum-v0"
    err = run_error(capsys, *offline_run(tmp_path, f"algo.dataset='{missing}'"))
    assert f"no directory {missing}" in err
    assert "harness collect RUN_DIR --episodes N --out PATH" in err


def test_dataset_id_under_a_root(
    tmp_path: Path, pendulum_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An id is looked up under algo.dataset_root; a wrong id names the root it searched."""
    err = run_error(
        capsys,
        *offline_run(
            tmp_path,
            "algo.dataset='pendulum-nosie-v0'",
            f"algo.dataset_root='{pendulum_dataset.parent}'",
        ),
    )
    assert f"no Minari dataset 'pendulum-nosie-v0' under {pendulum_dataset.parent}" in err


@pytest.mark.parametrize("damage", ["metadata", "hdf5", "no-hdf5"])
def test_corrupt_dataset_names_the_file(
    damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = random_dataset(tmp_path / "pendulum-broken-v0", PENDULUM_INFO)
    data = dataset / "data"
    if damage == "metadata":
        (data / "metadata.json").write_text('{"dataset_id": "pendulum-broken-v0", ')
        named = data / "metadata.json"
    elif damage == "hdf5":
        (data / "main_data.hdf5").write_bytes(b"not an hdf5 file" * 64)
        named = data / "main_data.hdf5"
    else:
        (data / "main_data.hdf5").unlink()
        named = data / "main_data.hdf5"
    err = run_error(capsys, *offline_run(tmp_path, f"algo.dataset='{dataset}'"))
    assert str(named) in err
    assert "harness collect" in err


def test_offline_algorithm_without_dataset_names_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for algo in ("cql", "bcq"):
        err = run_error(capsys, *offline_run(tmp_path, f"algo={algo}"))
        assert f"Algorithm {algo!r} learns offline from a dataset, but algo.dataset is empty" in err
        assert "--set algo.dataset=PATH" in err


def test_offline_algorithm_refuses_actors(
    tmp_path: Path, pendulum_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = run_error(
        capsys,
        *offline_run(tmp_path, f"algo.dataset='{pendulum_dataset}'", "actors=2", "num_envs=2"),
    )
    assert "learns offline from a dataset" in err and "run.actors" in err


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["no/such/run"], ["no/such/run does not exist", "--policy random"]),
        ([str(PENDULUM)], ["holds no complete checkpoint", "--policy random"]),
        (
            ["pendulum", "--policy", "random", "--out", "{tmp}/pendulum"],
            ["named by its id, NAME-vVERSION", "pendulum-v0"],
        ),
        (["pendulum", "--policy", "random", "--episodes", "0"], ["at least one episode"]),
        (
            ["pendulum", "--policy", "random", "--set", "env=CartPol-v1"],
            ["'CartPol-v1'", "CartPole-v1"],
        ),
    ],
)
def test_collect_bad_source(
    args: list[str], needles: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "d-v0")]
    if "--episodes" not in argv:
        argv += ["--episodes", "2"]
    err = run_error(capsys, "collect", *argv)
    for needle in needles:
        assert needle in err, err
    assert not (tmp_path / "d-v0").exists()


def test_collect_refuses_to_overwrite(
    pendulum_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["collect", "pendulum", "--policy", "random", "--episodes", "1"]
    err = run_error(capsys, *argv, "--out", str(pendulum_dataset))
    assert f"--out {pendulum_dataset} already exists" in err


def test_collect_help_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["collect", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for needle in ("Minari dataset", "--noise", "--policy", "NAME-vN", "seed S + i", "algo=cql"):
        assert needle in out


def test_collect_refuses_a_multi_agent_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("mpe2", reason="pip install 'harness[multiagent]'")
    out = tmp_path / "spread-v0"
    argv = ["collect", "pendulum", "--policy", "random", "--episodes", "1", "--out", str(out)]
    err = run_error(capsys, *argv, "--set", "env=mpe2/simple_spread_v3", "--set", "algo=random")
    assert "'mpe2/simple_spread_v3' is a multi-agent env (agents: agent_0" in err
    assert not out.exists()
