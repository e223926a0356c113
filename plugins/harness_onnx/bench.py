"""Per-step latency of an exported policy in onnxruntime against harness's own numpy acting
(``agent.predict``, what ``harness eval`` and farm actors run), one observation per call: what
a MyoChallenge evaluator's loop pays per env step. Untrained agents (latency does not depend
on the weights) at the sizes of the MyoChallenge packs' policies.

    python -m harness_onnx.bench                 # every case, 2000 calls each
    python -m harness_onnx.bench --calls 200     # a smoke run

onnxruntime runs with one intra-op thread (an evaluator steps one env per process).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from harness.api import Agent, EnvInfo, SpaceInfo

CASES: list[tuple[str, str, int, int, dict[str, Any]]] = [
    # (label, algo, obs_dim, act_dim, [algo] options)
    ("ppo mlp 64x64, Die Reorient dims", "ppo", 102, 39, {"hidden": [64, 64]}),
    ("ppo mlp 256x256 + normalize_obs, OSL dims", "ppo", 260, 54, {
        "hidden": [256, 256], "normalize_obs": True}),
    ("ppo lstm 128 + 64x64, Die Reorient dims", "ppo", 102, 39, {
        "hidden": [64, 64], "recurrent": "lstm", "rnn_hidden": 128}),
    ("sac mlp 256x256, OSL dims", "sac", 260, 54, {}),
]  # fmt: skip


def make_agent(algo: str, obs_dim: int, act_dim: int, options: dict[str, Any]) -> Agent:
    from harness.plugins import collect_registry, make_plugin_manager

    registry = collect_registry(make_plugin_manager())
    bspec = registry.backends.get("torch")
    assert bspec.config_cls is not None
    backend = bspec.load(bspec.config_cls(threads=1))
    obs = SpaceInfo("box", (obs_dim,), "float32")
    act = SpaceInfo("box", (act_dim,), "float32", low=(-1.0,) * act_dim, high=(1.0,) * act_dim)
    spec = registry.algorithms.get(algo)
    agent: Agent = spec.make_agent(
        EnvInfo("bench", obs, act, 1), backend, spec.config_cls(**options), seed=0
    )
    return agent


def per_call_us(fn: Callable[[], Any], calls: int, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean time of one call, in microseconds."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def bench_case(
    algo: str, obs_dim: int, act_dim: int, options: dict[str, Any], calls: int
) -> tuple[float, float, int]:
    """(numpy predict us, onnxruntime us, model bytes) for one policy, batch 1."""
    from harness_onnx.graph import build_model

    ort = importlib.import_module("onnxruntime")
    agent = make_agent(algo, obs_dim, act_dim, options)
    program = agent.policy().program()
    assert program is not None
    data = build_model(program, {"algo": algo}).SerializeToString()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    session = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    obs = np.random.default_rng(0).standard_normal((1, obs_dim)).astype(np.float32)
    feeds: dict[str, np.ndarray] = {"obs": obs}
    if program.state_size:
        feeds["state"] = program.initial_state(1)
    agent.predict_episodes_ended(np.ones(1, bool))
    numpy_us = per_call_us(lambda: agent.predict(obs), calls)
    onnx_us = per_call_us(lambda: session.run(None, feeds), calls)
    return numpy_us, onnx_us, len(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness_onnx.bench", description=__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="calls per timing (default 2000)")
    args = parser.parse_args(argv)
    print("| policy | numpy predict (us/step) | onnxruntime (us/step) | ONNX file (KiB) |")
    print("| --- | ---: | ---: | ---: |")
    for label, algo, obs_dim, act_dim, options in CASES:
        numpy_us, onnx_us, size = bench_case(algo, obs_dim, act_dim, options, args.calls)
        print(f"| {label} | {numpy_us:.1f} | {onnx_us:.1f} | {size / 1024:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
