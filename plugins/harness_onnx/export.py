"""``harness export RUN``: a run's greedy policy as a self-contained ONNX file.

The agent's policy describes its greedy acting (``Agent.policy().program()``, by default
``Agent.policy_program``: the layers of the numpy copies it acts with, observation
standardisation, the output transform); :mod:`.graph` writes
that description as ONNX. Before the file is written, onnxruntime runs it on probe
observations (for a recurrent policy, a sequence carrying its state) and its actions must equal
the numpy evaluation's, the arithmetic ``harness eval`` acts with.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import Agent
from harness.errors import CheckpointError, ConfigError, IncompatibleError, MissingExtraError
from harness.numpy_nets import PolicyProgram, Standardize
from harness.registry import Registry
from harness.rundir import (
    check_checkpoint_files,
    check_writable_dir,
    locked_for_writing,
    run_dir_of,
)

EXPORTABLE_ALGOS = ("a2c", "ddpg", "dqn", "impala", "pg", "ppo", "sac", "td3")
"""The first-party algorithms whose agents describe their greedy policy
(tests/integration/test_export_onnx.py builds every registered algorithm and holds this list
to what their agents do)."""
EXPORTABLE = (
    "a2c, impala, pg, ppo (MLP or LSTM/GRU policies over flat observations, normalize_obs "
    "included), sac, td3, ddpg (algo.ensemble = 1), dqn"
)
""":data:`EXPORTABLE_ALGOS` as a refusal names them."""
ATOL = 1e-4
"""Largest difference allowed between onnxruntime's and numpy's box actions at export; float32
rounding gives ~1e-6 on 256-wide layers (test_export_onnx.py: SAC 256x256, 9.5e-7)."""
PROBE_ROWS, PROBE_STEPS = 16, 8
"""Probe observations: a batch of 16, stepped 8 times (a recurrent policy's state carried)."""


@dataclass
class ExportResult:
    """What ``harness export`` wrote."""

    path: Path
    size: int
    algo: str
    env_id: str
    checkpoint: Path
    program: PolicyProgram
    max_diff: float
    """Largest |onnxruntime - numpy| over the probe actions (box; 0 for discrete)."""

    def summary(self) -> str:
        p = self.program
        kind = "discrete" if p.discrete else "box"
        recurrent = (
            f"; recurrent ({p.recurrent.kind}): input 'state' and output 'state_out' "
            f"(batch, {p.state_size}), zeros at an episode's start"
            if p.recurrent is not None
            else ""
        )
        return (
            f"wrote {self.path} ({self.size / 1024:.1f} KiB): {self.algo} on {self.env_id} from "
            f"{self.checkpoint}. Input 'obs' float32 (batch, {p.obs_dim}); output 'actions' "
            f"({kind}, {p.act_dim}{' choices' if p.discrete else ' values'}){recurrent}. "
            f"onnxruntime's actions equal the numpy policy's on {PROBE_ROWS * PROBE_STEPS} "
            f"probe observations{'' if p.discrete else f' (max |diff| {self.max_diff:.1e})'}."
        )


def require_onnx() -> tuple[Any, Any]:
    """``(onnx, onnxruntime)``, or the error naming the extra that installs them."""
    try:
        onnx = importlib.import_module("onnx")
        ort = importlib.import_module("onnxruntime")
    except ModuleNotFoundError as exc:
        raise MissingExtraError("onnx", exc.name or "onnx", "harness export") from None
    return onnx, ort


def checkpoint_source(source: Path, checkpoint: str | None) -> Path:
    """SOURCE, or the checkpoint ``checkpoint`` names inside its ``checkpoints/``."""
    if not source.exists():
        raise CheckpointError(
            f"{source} does not exist. Pass a run directory of `harness run` (or a checkpoint "
            "directory inside it)."
        )
    if checkpoint is None:
        return source
    if (source / "meta.json").is_file():
        raise ConfigError(f"{source} is a checkpoint directory already; drop --checkpoint.")
    chosen = source / "checkpoints" / checkpoint
    if not chosen.is_dir():
        found = sorted(p.name for p in (source / "checkpoints").glob("step_*"))
        raise CheckpointError(
            f"--checkpoint {checkpoint}: {chosen} does not exist. The checkpoints of {source}: "
            f"{', '.join(found) or 'none'}."
        )
    return chosen


def describe(agent: Agent, algo: str) -> PolicyProgram:
    """The agent's :class:`PolicyProgram`, or the refusal naming what can be exported."""
    try:
        program = agent.policy().program()
    except IncompatibleError as exc:
        raise IncompatibleError(f"{exc} Exportable: {EXPORTABLE}.") from None
    if program is None:
        raise IncompatibleError(
            f"algo {algo!r} cannot be exported: its agent does not describe its greedy policy "
            f"as data (Agent.policy_program). Exportable: {EXPORTABLE}."
        )
    return program


def probe_observations(program: PolicyProgram, rng: np.random.Generator) -> np.ndarray:
    """``(PROBE_STEPS, PROBE_ROWS, obs_dim)`` observations around where the policy looks: its
    standardisation's mean and spread where it has one, else standard normal."""
    shape = (PROBE_STEPS, PROBE_ROWS, program.obs_dim)
    noise = rng.standard_normal(shape)
    first = program.ops[0] if program.ops else None
    if isinstance(first, Standardize):
        noise = first.mean + 1.5 * first.std * noise
    return noise.astype(np.float32)


def run_session(session: Any, program: PolicyProgram, obs: np.ndarray) -> np.ndarray:
    """onnxruntime's actions for ``obs`` ``(T, B, obs_dim)``, the state carried from zeros."""
    state = program.initial_state(obs.shape[1])
    actions = []
    for step in obs:
        feeds = {"obs": step} | ({"state": state} if program.state_size else {})
        out = session.run(None, feeds)
        actions.append(out[0])
        if program.state_size:
            state = out[1]
    return np.stack(actions)


def run_program(program: PolicyProgram, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The numpy program's actions for ``obs`` ``(T, B, obs_dim)`` and, for a discrete one,
    the values its argmax picks from (logits or Q-values), the state carried from zeros."""
    head = PolicyProgram(program.ops[:-1], program.obs_dim, program.act_dim, discrete=False)
    state, actions, scores = None, [], []
    for step in obs:
        if program.discrete:
            values, _ = head(step, state)
            scores.append(values)
        action, state = program(step, state)
        actions.append(action)
    return np.stack(actions), np.stack(scores) if scores else np.empty(0)


def verify(model_bytes: bytes, program: PolicyProgram, ort: Any, seed: int = 0) -> float:
    """Run the model in onnxruntime on probe observations: its actions must be the numpy
    program's (box: within :data:`ATOL`; discrete: equal, except where the two best values are
    within float32 rounding of each other). Returns the largest box difference."""
    obs = probe_observations(program, np.random.default_rng(seed))
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    got = run_session(session, program, obs)
    want, scores = run_program(program, obs)
    if program.discrete:
        top2 = np.sort(scores, axis=-1)[..., -2:] if scores.shape[-1] > 1 else None
        tie = np.zeros(want.shape, bool) if top2 is None else top2[..., 1] - top2[..., 0] < ATOL
        bad = (got != want) & ~tie
        diff = 0.0
    else:
        diff = float(np.abs(got - want).max())
        bad = np.abs(got - want) > ATOL
    if bad.any():  # a graph that computes something else: a bug, not a user's error
        raise RuntimeError(
            f"the ONNX graph's actions differ from the numpy policy's on {int(bad.sum())} of "
            f"{bad.size} probe values (max |diff| {diff:.2e}); nothing was written."
        )
    return diff


def metadata(
    program: PolicyProgram, algo: str, env_id: str, backend: str, ckpt: Path
) -> dict[str, str]:
    """The model's ``metadata_props``: where it comes from and its interface."""
    import harness

    cell = program.recurrent
    return {
        "harness_version": str(harness.__version__),
        "algo": algo,
        "env_id": env_id,
        "backend": backend,
        "checkpoint": ckpt.name,
        "obs_dim": str(program.obs_dim),
        "act_dim": str(program.act_dim),
        "action_kind": "discrete" if program.discrete else "box",
        "recurrent": "none" if cell is None else cell.kind,
        "state_size": str(program.state_size),
    }


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def default_out(ckpt: Path) -> Path:
    """``RUN_DIR/policy.onnx`` for a checkpoint in ``RUN_DIR/checkpoints``; beside it
    otherwise."""
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    return run_dir / "policy.onnx"


def export(
    source: Path,
    registry: Registry,
    *,
    out: Path | None = None,
    checkpoint: str | None = None,
    overrides: Sequence[str] = (),
) -> ExportResult:
    """Export SOURCE's greedy policy (its newest checkpoint, or ``checkpoint``) as ONNX to
    ``out`` (default :func:`default_out`)."""
    from harness.commands import checkpoint_config
    from harness.runtime import load_agent
    from harness_onnx.graph import build_model

    _onnx, ort = require_onnx()  # before the (slow) agent: a missing extra fails first
    chosen = checkpoint_source(source, checkpoint)
    if out is not None:
        check_out(out)
    # the run directory written into (the default RUN/policy.onnx) is locked while the
    # checkpoint loads: no training run rotates it away meanwhile
    with locked_for_writing(run_dir_of(chosen if out is None else out.parent), "harness export"):
        config, ckpt = checkpoint_config(chosen, overrides, registry)
        check_checkpoint_files(ckpt)
        run = config.run
        program = describe(load_agent(config, registry, ckpt), run.algo)
        props = metadata(program, run.algo, run.env, run.backend, ckpt)
        doc = f"harness {run.algo} policy for {run.env} ({ckpt}); interface: docs/export.md"
        data = build_model(program, props, doc=doc).SerializeToString()
        diff = verify(data, program, ort)
        path = out if out is not None else default_out(ckpt)
        if out is None:
            check_out(path)
        write_atomic(path, data)
    return ExportResult(path, len(data), run.algo, run.env, ckpt, program, diff)


def check_out(path: Path) -> None:
    """Refuse an ONNX file path that cannot be written (a directory, a read-only or
    missing-and-uncreatable directory) before the agent is loaded."""
    if path.is_dir():
        raise ConfigError(
            f"--out {path} is a directory; give a file name, e.g. {path / 'policy.onnx'}."
        )
    check_writable_dir(path.parent, "The directory of --out")
