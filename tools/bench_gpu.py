"""Learner updates per second: CPU against CUDA, with mixed precision and pinned staging.

Run on a machine with a CUDA device (torch must see it; without one only the CPU rows run):

    python tools/bench_gpu.py                    # all cases, ~2 min
    python tools/bench_gpu.py --seconds 1        # quicker
    python tools/bench_gpu.py --json out.json --markdown out.md

Each case builds the real learner (``harness_algos`` DQN or PPO on the torch backend) and
calls its ``learn`` with fresh host batches (numpy arrays, as the replay memory or the rollout
buffer hands them over), so host-to-device copies are included. Every update reads its losses
back (``.item()``), as training does, so each one waits for the device. Rates are updates per
second over ``--seconds`` after a warm-up; CPU rows use every core of the machine.

Cases:

* ``dqn-cartpole``: obs 4, hidden [256, 256], batch 64 (the CartPole pack's sizes).
* ``dqn-atari``: stacked 84x84 frames (4 x 84 x 84 uint8, flattened) into hidden [512, 512],
  batch 256: 2 x 7.2 MB of uint8 frames per update, where pinned staging matters.
* ``ppo-cartpole``: obs 4, hidden [64, 64], minibatch 256.
* ``ppo-big``: obs 376 (Humanoid-sized), hidden [1024, 1024], minibatch 4096, 17 actions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for sub in ("", "plugins/harness_torch", "plugins/harness_algos"):
    sys.path.insert(0, str(ROOT / sub))


@dataclass
class Case:
    name: str
    algo: str
    obs_shape: tuple[int, ...]
    obs_dtype: str
    actions: int
    hidden: list[int]
    batch: int


CASES = [
    Case("dqn-cartpole", "dqn", (4,), "float32", 2, [256, 256], 64),
    Case("dqn-atari", "dqn", (4, 84, 84), "uint8", 6, [512, 512], 256),
    Case("ppo-cartpole", "ppo", (4,), "float32", 2, [64, 64], 256),
    Case("ppo-big", "ppo", (376,), "float32", 17, [1024, 1024], 4096),
]


def _batches(case: Case, rng: np.random.Generator, count: int) -> list[Any]:
    from harness.data import ReplayBatch, RolloutBatch

    def obs(n: int) -> np.ndarray:
        if case.obs_dtype == "uint8":
            return rng.integers(0, 255, (n, *case.obs_shape), dtype=np.uint8)
        return rng.standard_normal((n, *case.obs_shape)).astype(np.float32)

    n = case.batch
    out: list[Any] = []
    for _ in range(count):
        if case.algo == "dqn":
            out.append(
                ReplayBatch(
                    obs=obs(n),
                    actions=rng.integers(0, case.actions, n),
                    rewards=rng.standard_normal(n).astype(np.float32),
                    next_obs=obs(n),
                    dones=(rng.random(n) < 0.05).astype(np.float32),
                    weights=np.ones(n, np.float32),
                    indices=np.arange(n),
                )
            )
        else:
            out.append(
                RolloutBatch(
                    obs=obs(n),
                    actions=rng.integers(0, case.actions, n),
                    log_probs=np.full(n, -np.log(case.actions), np.float32),
                    advantages=rng.standard_normal(n).astype(np.float32),
                    returns=rng.standard_normal(n).astype(np.float32),
                    values=np.zeros(n, np.float32),
                )
            )
    return out


def measure(case: Case, device: str, amp: str, pin: bool, seconds: float) -> dict[str, Any]:
    from harness.api import EnvInfo, SpaceInfo
    from harness_algos.dqn import DQN, DQNConfig
    from harness_algos.ppo import PPO, PPOConfig
    from harness_torch.backend import TorchBackend
    from harness_torch.plugin import TorchConfig

    info = EnvInfo(
        env_id=case.name,
        observation=SpaceInfo(kind="box", shape=case.obs_shape, dtype=case.obs_dtype),
        action=SpaceInfo(kind="discrete", shape=(), dtype="int64", n=case.actions),
        num_envs=1,
    )
    bk = TorchBackend(
        TorchConfig(device=device, amp=amp, pin_memory=pin, threads=os.cpu_count() or 1)
    )
    bk.seed(0)
    if case.algo == "dqn":
        learner: Any = DQN(bk, info, DQNConfig(hidden=case.hidden, batch_size=case.batch))
    else:
        learner = PPO(bk, info, PPOConfig(hidden=case.hidden, batch_size=case.batch))
    batches = _batches(case, np.random.default_rng(0), 8)
    for b in batches[:3]:  # warm-up: kernels, allocator, staging buffers
        learner.learn(b)
    sync = _sync(device)
    sync()
    done, start = 0, time.perf_counter()
    while True:
        learner.learn(batches[done % len(batches)])
        done += 1
        if done % 4 == 0 and time.perf_counter() - start >= seconds:
            break
    sync()
    elapsed = time.perf_counter() - start
    return {
        "case": case.name,
        "device": device,
        "amp": amp,
        "pin_memory": pin,
        "updates_per_s": done / elapsed,
        "updates": done,
        "peak_mb": bk.device_stats().get("gpu/torch_peak_mb", 0.0),
    }


def _sync(device: str) -> Any:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


def report(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"Date: {meta['date']}; command: `{meta['command']}`",
        "",
        f"Machine: {meta['machine']}; {meta['versions']}",
        "",
        "| case | device | amp | pinned staging | updates/s | vs CPU |",
        "|---|---|---|---|---:|---:|",
    ]
    cpu = {r["case"]: r["updates_per_s"] for r in rows if r["device"] == "cpu"}
    for r in rows:
        base = cpu.get(r["case"])
        ratio = f"{r['updates_per_s'] / base:.2f}x" if base else "—"
        pin = "yes" if r["pin_memory"] and r["device"] != "cpu" else "no"
        lines.append(
            f"| {r['case']} | {r['device']} | {r['amp']} | {pin} "
            f"| {r['updates_per_s']:,.0f} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per row")
    parser.add_argument("--cases", default=",".join(c.name for c in CASES))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    import torch

    wanted = set(args.cases.split(","))
    cuda = torch.cuda.is_available()
    rows: list[dict[str, Any]] = []
    for case in (c for c in CASES if c.name in wanted):
        variants = [("cpu", "off", False)]
        if cuda:
            variants += [("cuda", "off", True), ("cuda", "bf16", True), ("cuda", "fp16", True)]
            if case.obs_dtype == "uint8":
                variants.append(("cuda", "off", False))
        for device, amp, pin in variants:
            row = measure(case, device, amp, pin, args.seconds)
            rows.append(row)
            print(
                f"{case.name:13s} {device:4s} amp={amp:4s} pin={pin!s:5s} "
                f"{row['updates_per_s']:10,.1f} updates/s",
                flush=True,
            )
    gpu = torch.cuda.get_device_name(0) if cuda else "no CUDA device"
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python tools/bench_gpu.py " + " ".join(argv or sys.argv[1:]),
        "machine": f"{gpu}, {os.cpu_count()} CPUs ({platform.machine()})",
        "versions": f"python {platform.python_version()}, torch {torch.__version__}, "
        f"numpy {np.__version__}",
    }
    text = report(rows, meta)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
