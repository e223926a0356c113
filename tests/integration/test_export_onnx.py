"""``harness export RUN --format onnx`` (plugins/harness_onnx): the ONNX graph onnxruntime runs
takes the actions ``harness eval`` takes.

- Step by step over real env episodes, onnxruntime's actions equal the agent's ``predict``
  (box: atol 1e-5; discrete: equal), for PPO (discrete; box with ``normalize_obs``; LSTM and GRU
  with the state carried through a 200-step episode and zeroed at the next one's start), SAC,
  TD3 and DQN, and on the paddle backend.
- Every registered single-agent algorithm either describes its greedy policy
  (``Agent.policy_program``), and then the description's numpy evaluation equals ``predict`` on
  random observations, or is refused by name; the refusal's list of exportable algorithms is
  held to what the agents do.
- The CLI: a trained run exports (exit 0, the file, its metadata and interface), a run of an
  algorithm without a description and a missing run directory exit 2 with one paragraph.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from harness.api import Agent, EnvInfo, SpaceInfo
from harness.errors import IncompatibleError, MissingExtraError
from harness.numpy_nets import Dense, PolicyProgram
from harness.plugins import collect_registry, make_plugin_manager
from harness.registry import Registry
from harness.runtime import env_info, load_agent, make_envs

onnx = pytest.importorskip("onnx", reason="harness[onnx] is in the dev extra")
ort = pytest.importorskip("onnxruntime", reason="harness[onnx] is in the dev extra")

from harness_onnx import export as export_mod  # noqa: E402 - after the importorskip
from harness_onnx.graph import IR_VERSION, OPSET, build_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "competitions" / "cartpole"
BOX_ATOL = 1e-5


@pytest.fixture(scope="module")
def registry() -> Registry:
    return collect_registry(make_plugin_manager())


def backend(registry: Registry, name: str = "torch") -> Any:
    spec = registry.backends.get(name)
    assert spec.config_cls is not None
    return spec.load(spec.config_cls(threads=1))


def make(registry: Registry, algo: str, env_id: str, bk: Any, **options: Any) -> Agent:
    """An untrained agent (random weights: parity needs no training) for one env."""
    env = gym.make(env_id)
    info = EnvInfo(env_id, space(env.observation_space), space(env.action_space), 1)
    env.close()
    spec = registry.algorithms.get(algo)
    agent: Agent = spec.make_agent(info, bk, spec.config_cls(**options), seed=3, total_steps=10)
    return agent


def space(s: Any) -> SpaceInfo:
    if isinstance(s, gym.spaces.Discrete):
        return SpaceInfo("discrete", (), "int64", n=int(s.n))
    return SpaceInfo(
        "box",
        s.shape,
        str(s.dtype),
        low=tuple(float(v) for v in s.low.ravel()),
        high=tuple(float(v) for v in s.high.ravel()),
    )


def session(program: PolicyProgram, props: Mapping[str, str] | None = None) -> Any:
    model = build_model(program, props or {"algo": "test"})
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def fit_statistics(agent: Agent, env_id: str) -> None:
    """Give ``normalize_obs`` non-trivial statistics (what its updates would have gathered)."""
    env = gym.make(env_id)
    env.reset(seed=11)
    rows = [env.step(env.action_space.sample())[0] for _ in range(300)]
    env.close()
    moments = agent.algorithm.obs_norm  # type: ignore[attr-defined]
    moments.update(np.asarray(rows) * 1.7 + 0.3)
    agent.algorithm.refresh_policy()  # type: ignore[attr-defined]


def episode_parity(agent: Agent, env_id: str, steps: int) -> tuple[int, int]:
    """Step ``env_id`` with the agent's greedy actions for ``steps`` steps (a recurrent policy:
    on until a second episode started, at most 20 times as long: its state must be seen reset;
    a random-weight policy may balance CartPole for hundreds of steps, and its time limit ends
    it at 500); at every step the ONNX graph's action (its state carried and zeroed at episode
    starts, as ``harness eval`` resets ``predict``'s) must equal ``predict``'s. Returns
    (episodes started, longest run of steps a state was carried)."""
    program = agent.policy_program()
    assert program is not None
    sess = session(program)
    env = gym.make(env_id)
    obs, _ = env.reset(seed=5)
    agent.predict_episodes_ended(np.ones(1, bool))
    state = program.initial_state(1)
    episodes, carried, longest = 1, 0, 0
    t = 0
    while t < steps or (program.state_size and episodes < 2 and t < 20 * steps):
        t += 1
        want = agent.predict(obs[None])
        feeds = {"obs": np.asarray(obs, np.float32)[None]}
        if program.state_size:
            feeds["state"] = state
        out = sess.run(None, feeds)
        if program.discrete:
            assert out[0].dtype == np.int64 and out[0].tolist() == want.tolist(), (t, out[0], want)
        else:
            np.testing.assert_allclose(out[0], want.reshape(1, -1), atol=BOX_ATOL, err_msg=str(t))
        carried += 1
        obs, _, terminated, truncated, _ = env.step(want[0])
        if program.state_size:
            state = out[1]
        if terminated or truncated:
            longest, carried = max(longest, carried), 0
            agent.predict_episodes_ended(np.ones(1, bool))
            state = program.initial_state(1)
            obs, _ = env.reset()
            episodes += 1
    env.close()
    return episodes, max(longest, carried)


@pytest.mark.parametrize(
    ("algo", "env_id", "options", "steps"),
    [
        ("ppo", "CartPole-v1", {}, 60),
        ("ppo", "Pendulum-v1", {"normalize_obs": True}, 60),
        ("ppo", "Pendulum-v1", {"recurrent": "lstm", "rnn_hidden": 32}, 230),
        ("ppo", "CartPole-v1", {"recurrent": "gru", "rnn_hidden": 16}, 80),
        ("sac", "Pendulum-v1", {}, 60),
        ("td3", "Pendulum-v1", {}, 30),
        ("dqn", "CartPole-v1", {"dueling": True}, 60),
    ],
    ids=["ppo-discrete", "ppo-box-normalize", "ppo-lstm", "ppo-gru", "sac", "td3", "dqn-dueling"],
)
def test_onnx_actions_equal_predict_over_episodes(
    registry: Registry, algo: str, env_id: str, options: dict[str, Any], steps: int
) -> None:
    agent = make(registry, algo, env_id, backend(registry), **options)
    if options.get("normalize_obs"):
        fit_statistics(agent, env_id)
    episodes, longest = episode_parity(agent, env_id, steps)
    if options.get("recurrent"):  # the state was carried through episodes and reset after them
        assert episodes >= 2, episodes
        # Pendulum's episodes run 200 steps; the untrained greedy policy drops CartPole's pole
        # in about 10, so there the state is reset many times instead
        assert longest >= (200 if env_id == "Pendulum-v1" else 8), longest


def test_paddle_backend_exports_alike(registry: Registry) -> None:
    """The same algorithm file on paddle: its numpy copies (paddle's (in, out) layout and its
    recurrent layer's weights) describe the same policy, and the graph acts as it does."""
    pytest.importorskip("paddle", reason="paddle is in the dev extra")
    bk = backend(registry, "paddle")
    agent = make(registry, "ppo", "Pendulum-v1", bk, recurrent="lstm", rnn_hidden=16)
    episodes, longest = episode_parity(agent, "Pendulum-v1", 210)
    assert episodes >= 2 and longest >= 20


def single_agent_info(kind: str) -> EnvInfo:
    obs = SpaceInfo("box", (5,), "float32", low=(-10.0,) * 5, high=(10.0,) * 5)
    if kind == "discrete":
        return EnvInfo("probe", obs, SpaceInfo("discrete", (), "int64", n=3), 2)
    return EnvInfo(
        "probe", obs, SpaceInfo("box", (2,), "float32", low=(-2.0, 0.0), high=(2.0, 1.0)), 2
    )


def test_every_algorithm_is_described_or_refused(registry: Registry) -> None:
    """Each registered single-agent algorithm either describes its greedy policy, and the
    description's numpy evaluation equals ``predict`` on random observations, or returns None
    (refused by name); the refusal's list is exactly the algorithms that describe theirs."""
    bk = backend(registry)
    rng = np.random.default_rng(0)
    described = set()
    for name, spec in registry.algorithms.items():
        if spec.agents == "multi" or spec.plugin != "algos":
            continue
        for kind in spec.action_spaces:
            info = single_agent_info(kind)
            agent = spec.make_agent(info, bk, spec.config_cls(), seed=0, total_steps=10)
            program = agent.policy_program()
            if program is None:
                continue
            described.add(name)
            agent.predict_episodes_ended(np.ones(2, bool))
            state = None
            for _ in range(5):
                obs = rng.normal(0.0, 3.0, (2, 5)).astype(np.float32)
                want = agent.predict(obs)
                got, state = program(obs, state)
                if program.discrete:
                    assert got.tolist() == want.tolist(), name
                else:
                    np.testing.assert_allclose(got, want, atol=1e-6, err_msg=name)
    assert described == set(export_mod.EXPORTABLE_ALGOS)
    for name in described:
        assert name in export_mod.EXPORTABLE


def test_a_program_that_reads_the_wrong_width_is_refused() -> None:
    """An actor that reads more than the observation (BCQ's reads obs and action) cannot pass
    for the policy: the description checks every op's input width."""
    w = np.zeros((7, 2), np.float32)
    with pytest.raises(ValueError, match="reads 7 features, but the observation has 5"):
        PolicyProgram((Dense(w, np.zeros(2, np.float32)),), obs_dim=5, act_dim=2, discrete=False)


def test_describing_an_image_policy_is_refused(registry: Registry) -> None:
    """IMPALA's CNN over images acts through a framework forward: no description, a refusal
    naming the observation shape (the CLI adds the exportable list)."""
    frames = SpaceInfo("box", (4, 84, 84), "uint8", low=(0.0,), high=(255.0,))
    info = EnvInfo("ALE/Pong-v5", frames, SpaceInfo("discrete", (), "int64", n=6), 1)
    spec = registry.algorithms.get("impala")
    agent = spec.make_agent(info, backend(registry), spec.config_cls(), seed=0, total_steps=10)
    with pytest.raises(
        IncompatibleError, match=r"CNN over image observations of shape \(4, 84, 84\)"
    ):
        export_mod.describe(agent, "impala")


def test_a_missing_onnx_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> Any:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(export_mod.importlib, "import_module", missing)
    with pytest.raises(MissingExtraError, match=r"harness\[onnx\]"):
        export_mod.require_onnx()


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, timeout=180
    )


def train(tmp_path: Path, name: str, *overrides: str, steps: int = 1024) -> Path:
    proc = harness(
        "run", str(CARTPOLE), "--steps", str(steps), "--out", str(tmp_path), "--no-progress",
        "--set", f"name={name}", "--set", "eval_episodes=0", "--set", "trackers=['csv']",
        *(a for o in overrides for a in ("--set", o)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return tmp_path / name


def test_cli_exports_a_trained_run(tmp_path: Path, registry: Registry) -> None:
    """A few thousand steps of PPO on CartPole; ``harness export`` writes the graph, whose
    metadata and interface are documented, and which acts as ``harness eval``'s agent does
    over real episodes (through the harness env, as eval steps it)."""
    run_dir = train(tmp_path, "ppo", steps=2048)
    out = tmp_path / "cartpole.onnx"
    proc = harness("export", str(run_dir), "--format", "onnx", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and f"wrote {out}" in proc.stdout

    model = onnx.load(str(out))
    assert model.ir_version == IR_VERSION and model.opset_import[0].version == OPSET
    props = {p.key: p.value for p in model.metadata_props}
    assert props["algo"] == "ppo" and props["env_id"] == "CartPole-v1"
    assert props["obs_dim"] == "4" and props["act_dim"] == "2" and props["recurrent"] == "none"
    assert props["action_kind"] == "discrete" and props["harness_version"]
    assert [i.name for i in model.graph.input] == ["obs"]
    assert [o.name for o in model.graph.output] == ["actions"]

    from harness.commands import checkpoint_config

    config, ckpt = checkpoint_config(run_dir, [], registry)
    agent = load_agent(config, registry, ckpt)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    envs = make_envs(config, registry, 2, seed=None)
    try:
        assert env_info(config.run.env, envs).observation.flat_dim == 4
        obs, _ = envs.reset(seed=9)
        agent.predict_episodes_ended(np.ones(2, bool))
        for _ in range(100):
            want = agent.predict(obs)
            (got,) = sess.run(None, {"obs": np.asarray(obs, np.float32)})
            assert got.tolist() == want.tolist()
            obs, _, terminated, truncated, _ = envs.step(want)
            agent.predict_episodes_ended(terminated | truncated)
    finally:
        envs.close()

    # a named checkpoint, and the default file beside the run
    proc = harness("export", str(run_dir), "--checkpoint", ckpt.name)
    assert proc.returncode == 0, proc.stderr
    assert (run_dir / "policy.onnx").is_file()


def assert_one_paragraph(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("harness: error: ") and "\n\n" not in proc.stderr.strip()
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_cli_refusals(tmp_path: Path) -> None:
    assert_one_paragraph(harness("export", str(tmp_path / "missing")), "does not exist")
    run_dir = train(tmp_path, "random", "algo=random", steps=256)
    assert_one_paragraph(
        harness("export", str(run_dir)),
        "algo 'random' cannot be exported",
        "Exportable: a2c, impala, pg, ppo",
    )
    assert not (run_dir / "policy.onnx").exists()
    assert_one_paragraph(
        harness("export", str(run_dir), "--checkpoint", "step_1"), "The checkpoints of"
    )
