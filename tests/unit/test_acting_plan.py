"""``run.inference`` is decided once, at build time, into the run's ``ActingPlan``
(``harness.runtime.acting.plan_acting``): one plan per mode (serial, per actor, central),
computed once per run and read by the collector and the farm; its refusals are start-up
checks (nothing is written: no run directory)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import harness.runtime.acting as acting
import harness.runtime.build as build
from harness import hookimpl
from harness.api import Agent
from harness.config import Config, find_pack_file, layer, resolve
from harness.errors import ConfigError
from harness.plugins import collect_registry, make_plugin_manager
from harness.registry import AlgorithmSpec
from harness.runtime import env_info, make_agent, make_envs, train
from harness.runtime.acting import CENTRAL, PER_ACTOR, SERIAL, ActingPlan, plan_acting

ROOT = Path(__file__).resolve().parents[2]
PACK = find_pack_file(ROOT / "competitions" / "cartpole")
ES = ROOT / "competitions" / "cartpole" / "es.toml"
R2D2 = ROOT / "competitions" / "cartpole" / "r2d2.toml"
MASKED_PPO = ROOT / "competitions" / "cartpole" / "masked_ppo.toml"


def _config(files: list[Path], overrides: list[str], out: Path | None = None) -> Config:
    base = ["progress=false", "trackers=['csv']"] + ([f"out='{out}'"] if out else [])
    registry = collect_registry(make_plugin_manager())
    return resolve(layer(PACK, files, base + overrides, environ={}), registry)


def _plan(files: list[Path], overrides: list[str]) -> ActingPlan:
    config = _config(files, overrides)
    registry = collect_registry(make_plugin_manager())
    envs = make_envs(config, registry, 1, seed=None)
    info = dataclasses.replace(env_info(config.run.env, envs), num_envs=config.run.num_envs)
    envs.close()
    return plan_acting(config, make_agent(config, registry, info))


@pytest.mark.parametrize(
    ("files", "overrides", "want"),
    [
        ([], ["actors=0", "inference='auto'"], (SERIAL, False, 0.0, False)),
        ([], ["actors=2", "inference='actor'"], (PER_ACTOR, False, 0.0, False)),
        ([], ["actors=2", "inference='auto'"], (PER_ACTOR, False, 0.0, False)),
        (
            [],
            ["actors=2", "inference='central'", "inference_wait_ms=3"],
            (CENTRAL, False, 3e-3, False),
        ),
        ([MASKED_PPO], ["actors=2", "inference='central'"], (CENTRAL, True, 0.0, False)),
        (
            [],
            ["actors=2", "inference='central'", "cluster='tcp://127.0.0.1:1'"],
            (CENTRAL, False, 0.0, True),
        ),
        ([ES], ["actors=128", "num_envs=128", "inference='auto'"], (CENTRAL, True, 0.0, False)),
        ([ES], ["actors=2", "inference='central'"], (CENTRAL, True, 0.0, False)),
        ([R2D2], ["actors=2", "inference='central'"], (CENTRAL, True, 0.0, False)),
    ],
    ids=[
        "serial",
        "actor",
        "auto-few",
        "central",
        "central-recurrent",
        "central-remote",
        "auto-es",
        "central-es",
        "central-r2d2",
    ],
)
def test_each_mode_resolves_to_one_plan(
    files: list[Path], overrides: list[str], want: tuple[str, bool, float, bool]
) -> None:
    plan = _plan(files, overrides)
    assert (plan.where, plan.by_rows, plan.wait_s, plan.relay) == want, plan.why
    assert plan.central == (want[0] == CENTRAL)


class _Seen:
    """Keeps what the run's hooks see of the plan: the run's, and the collector's."""

    def __init__(self) -> None:
        self.plans: list[ActingPlan] = []
        self.collector_plan: Any = None
        self.server: Any = None

    @hookimpl
    def harness_iteration_end(self, run: Any, metrics: Any) -> None:
        self.plans.append(run.acting)
        self.collector_plan = getattr(run.collector, "acting", None)
        self.server = getattr(run.collector, "server", None)


def _counting(calls: list[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return fn(*args, **kwargs)

    return counted


def _train_counting(
    tmp_path: Path, overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[_Seen, list[str]]:
    """A tiny run of ``overrides`` with the real ``plan_acting`` and ``choose_central``
    counted wherever the runtime calls them."""
    calls: list[str] = []
    monkeypatch.setattr(build, "plan_acting", _counting(calls, "plan", build.plan_acting))
    monkeypatch.setattr(acting, "choose_central", _counting(calls, "choose", acting.choose_central))
    pm = make_plugin_manager()
    seen = _Seen()
    pm.register(seen, name="seen")
    registry = collect_registry(pm)
    config = _config(
        [],
        [
            "algo='random'",
            "total_steps=64",
            "num_envs=2",
            "eval_episodes=0",
            "checkpoint_every=0",
            *overrides,
        ],
        tmp_path,
    )
    train(config, registry, pm)
    return seen, calls


def test_a_serial_run_plans_once_and_has_no_farm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen, calls = _train_counting(tmp_path, ["actors=0", "inference='auto'"], monkeypatch)
    assert calls == ["plan"]  # (no farm: the auto rule is never asked)
    assert seen.plans and {p.where for p in seen.plans} == {SERIAL}
    assert seen.collector_plan is None and seen.server is None  # the serial collector


@pytest.mark.distributed
@pytest.mark.parametrize(("inference_mode", "where"), [("actor", PER_ACTOR), ("central", CENTRAL)])
def test_a_farm_plans_once_and_acts_as_planned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inference_mode: str, where: str
) -> None:
    seen, calls = _train_counting(
        tmp_path, ["actors=2", f"inference='{inference_mode}'"], monkeypatch
    )
    assert calls == ["plan", "choose"], "run.inference was decided more than once"
    assert seen.plans and all(p is seen.plans[0] for p in seen.plans)
    assert seen.plans[0].where == where
    assert seen.collector_plan is seen.plans[0], "the farm did not act on the run's plan"
    assert (seen.server is not None) == (where == CENTRAL)


class _Legacy(Agent):
    """An agent written before ``Policy`` whose ``sample`` keeps per-env state (a real PPO
    agent's hooks behind it) that it cannot keep by row: one batch of a policy server would
    mix its envs up."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner.algorithm, inner.env_info, inner.config)
        self.inner = inner

    @property
    def per_env_acting_state(self) -> bool:
        return True

    def sample(self, obs: Any) -> Any:
        return self.inner.sample(obs)

    def predict(self, obs: Any) -> Any:
        return self.inner.predict(obs)

    def observe(self, transition: Any) -> None:
        self.inner.observe(transition)

    def learn(self) -> dict[str, float]:
        return self.inner.learn()


class _LegacyPlugin:
    @hookimpl
    def harness_register_algorithms(self) -> list[AlgorithmSpec]:
        ppo = collect_registry(make_plugin_manager()).algorithms.get("ppo")
        return [
            AlgorithmSpec(
                "legacy_stateful",
                lambda *args, **kwargs: _Legacy(ppo.make_agent(*args, **kwargs)),
                ppo.config_cls,
                plugin="tests",
            )
        ]


@pytest.mark.parametrize(
    ("overrides", "files", "match"),
    [
        (["actors=0"], (), r"run\.inference = 'central'.*run\.actors = 0.*--actors 2"),
        (
            ["actors=2", "algo='legacy_stateful'"],
            (),
            r"cannot serve algorithm 'legacy_stateful'.*acting state per env.*Agent\.acts_by_rows",
        ),
    ],
    ids=["serial", "legacy-stateful"],
)
def test_each_refusal_comes_before_the_run_directory_exists(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    overrides: list[str],
    files: tuple[Path, ...],
    match: str,
) -> None:
    made: list[Path] = []
    monkeypatch.setattr(build, "new_run_dir", _counting(made, "run dir", build.new_run_dir))
    pm = make_plugin_manager()
    pm.register(_LegacyPlugin(), name="legacy")
    registry = collect_registry(pm)
    base = ["progress=false", "trackers=['csv']", f"out='{tmp_path}'"]
    overrides = [*base, *overrides, "inference='central'"]
    config = resolve(layer(PACK, list(files), overrides, environ={}), registry)
    with pytest.raises(ConfigError, match=match), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (the legacy agent's adapter)
        train(config, registry, pm)
    assert made == [], "the run directory was made before the refusal"
    assert not any(tmp_path.iterdir()), "a refused start left something behind"


def test_the_cli_refuses_central_acting_of_a_serial_run_with_exit_2(tmp_path: Path) -> None:
    """The real CLI: one paragraph naming the key and the fix, exit 2, nothing written."""
    out = tmp_path / "runs"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            str(PACK.parent),
            "--out",
            str(out),
            "--set",
            "run.inference='central'",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("harness: error:") and "Traceback" not in proc.stderr
    assert "run.inference = 'central'" in proc.stderr and "--actors 2" in proc.stderr
    assert not out.exists() or not any(out.iterdir()), "a refused start left a run behind"


class _AgentActorsPlugin:
    """PPO registered without ``make_algorithm`` / ``make_policy`` (as a third-party
    algorithm written before them): its farm actors would build an agent to act."""

    @hookimpl
    def harness_register_algorithms(self) -> list[AlgorithmSpec]:
        ppo = collect_registry(make_plugin_manager()).algorithms.get("ppo")
        return [AlgorithmSpec("agent_actors", ppo.make_agent, ppo.config_cls, plugin="tests")]


@pytest.mark.parametrize(("algo", "warned"), [("agent_actors", True), ("ppo", False)])
def test_a_farm_of_an_algorithm_without_make_policy_is_warned_once(
    algo: str, warned: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A farm whose actors would build an agent only to act (no ``make_policy``) is told, once
    per algorithm, with a DeprecationWarning naming the two hooks; one that declares them
    (every first-party algorithm) is not."""
    monkeypatch.setattr(acting, "_WARNED", set())
    pm = make_plugin_manager()
    pm.register(_AgentActorsPlugin(), name="agent-actors")
    registry = collect_registry(pm)
    config = resolve(
        layer(PACK, [], ["actors=2", "num_envs=4", f"algo='{algo}'"], environ={}), registry
    )
    for attempt in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            envs, *_ = build._make_agent_and_envs(config, registry)
            envs.close()
        told = [w for w in caught if "make_algorithm / make_policy" in str(w.message)]
        assert len(told) == (warned and attempt == 0), [str(w.message) for w in caught]
        if told:
            assert told[0].category is DeprecationWarning
            assert "'agent_actors'" in str(told[0].message)
