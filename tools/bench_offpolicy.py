"""Time to the Pendulum-v1 threshold: harness's SAC and TD3 against Stable-Baselines3's with
the same hyper-parameters (the RL Zoo's Pendulum entries, competitions/pendulum), same machine,
same run, same torch thread count.

    .venv/bin/python tools/bench_offpolicy.py [--algos sac td3] [--seeds 1 2 3] \
        [--threads 1] [--sb3-python .venv-bench/bin/python] [--json out.json]

Each (algorithm, seed) trains once with harness and once with SB3 (the order alternates per
seed, so drift on a shared VM hits both alike), each in a fresh process, each evaluating
greedily on 10 episodes every 1,000 env steps and stopping at the first mean >= -200 (or the
20k budget). Reported: env steps and wall-clock (process start to stop, including its
evaluations and harness's curve plot; imports excluded, harness's lazy ones too) to the
threshold, and the ratio harness / SB3 per seed and of the medians (the two libraries' seeds
are independent draws; the median of the per-seed ratios is printed beside it). SB3 lives in
its own venv (.venv-bench: `pip install stable-baselines3`).

    .venv/bin/python tools/bench_offpolicy.py --per-update [--repeats 3]

measures what bounds that ratio, per gradient step, in the same run: harness's ``learn`` and
SB3's ``train`` on full replay batches (256 Pendulum transitions, the packs' networks), and
the physical limit of the maths on this core: the update's matrix products alone (forward,
weight and input gradients; only what the algorithm needs), timed back to back with the same
shapes and torch build. Each measurement is a fresh process; the order rotates per repeat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THRESHOLD = -200.0
BUDGET = 20_000
EVAL_EVERY = 1_000
EVAL_EPISODES = 10

# the RL Zoo's Pendulum-v1 entries (rl-baselines3-zoo hyperparams/{sac,td3}.yml), as in
# competitions/pendulum/pack.toml and td3.toml
SB3_KWARGS = {
    "sac": {"learning_rate": 1e-3},
    "td3": {
        "learning_rate": 1e-3,
        "gamma": 0.98,
        "buffer_size": 200_000,
        "learning_starts": 10_000,
        "gradient_steps": 1,
        "train_freq": 1,
        "policy_kwargs": {"net_arch": [400, 300]},
    },
}

HARNESS = r"""
import json, sys, time
from pathlib import Path
p = json.loads(sys.argv[1])
algo, seed, threads, out = p["algo"], p["seed"], p["threads"], p["out"]
from harness.config import find_pack_file, layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import train
import torch  # imported before the clock starts, as SB3's is
# and what the run imports lazily (the env, the algorithm, the backend, the curve's plotting)
import gymnasium.envs.classic_control, harness.plotting, harness_algos.sac, harness_algos.td3
import harness_gymnasium.plugin, harness_torch.backend
root = Path(p["root"])
pm = make_plugin_manager(); registry = collect_registry(pm)
users = [] if algo == "sac" else [root / "competitions" / "pendulum" / f"{algo}.toml"]
overrides = [f"seed={seed}", f"backend.threads={threads}", f"eval_every={p['eval_every']}",
             f"eval_episodes={p['episodes']}", f"stop_at_return={p['threshold']}",
             f"total_steps={p['budget']}", "checkpoint_every=0", "trackers=[]", f"out='{out}'"]
config = resolve(layer(find_pack_file(root / "competitions" / "pendulum"), users, overrides,
                       environ={}), registry)
t = time.perf_counter()
result = train(config, registry, pm)
print(json.dumps({"seconds": time.perf_counter() - t, "steps": result.steps,
                  "best": result.best_eval}))
"""

SB3 = r"""
import json, sys, time
p = json.loads(sys.argv[1])
algo, seed, threads, kwargs = p["algo"], p["seed"], p["threads"], p["kwargs"]
import gymnasium as gym, torch
from stable_baselines3 import SAC, TD3
from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
from stable_baselines3.common.noise import NormalActionNoise
import numpy as np
torch.set_num_threads(threads)
env = gym.make("Pendulum-v1")
if algo == "td3":
    kwargs["action_noise"] = NormalActionNoise(np.zeros(1), 0.1 * np.ones(1))
cls = {"sac": SAC, "td3": TD3}[algo]
t = time.perf_counter()
model = cls("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
stop = StopTrainingOnRewardThreshold(reward_threshold=p["threshold"], verbose=0)
cb = EvalCallback(gym.make("Pendulum-v1"), callback_on_new_best=stop,
                  n_eval_episodes=p["episodes"], eval_freq=p["eval_every"], deterministic=True,
                  verbose=0)
model.learn(total_timesteps=p["budget"], callback=cb)
print(json.dumps({"seconds": time.perf_counter() - t, "steps": model.num_timesteps,
                  "best": float(cb.best_mean_reward)}))
"""


HARNESS_UPDATE = r"""
import json, sys, time
import numpy as np
p = json.loads(sys.argv[1])
from harness_torch.plugin import TorchConfig, load
from harness.api import EnvInfo, SpaceInfo
from harness.data import ReplayBatch
from harness_algos.sac import SAC, SACConfig
from harness_algos.td3 import TD3, TD3Config
bk = load(TorchConfig(threads=p["threads"]))
info = EnvInfo("Pendulum-v1", SpaceInfo("box", (3,), "float32", low=(-8.0,) * 3,
               high=(8.0,) * 3), SpaceInfo("box", (1,), "float32", low=(-2.0,), high=(2.0,)), 1)
if p["algo"] == "sac":
    algo = SAC(bk, info, SACConfig(learning_rate=1e-3))
else:
    algo = TD3(bk, info, TD3Config(learning_rate=1e-3, gamma=0.98, hidden=[400, 300]))
rng = np.random.default_rng(0)
def batch():
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    return ReplayBatch(f(256, 3), np.clip(f(256, 1), -1, 1), f(256), f(256, 3),
                       np.zeros(256, np.float32), np.ones(256, np.float32), np.arange(256))
batches = [batch() for _ in range(32)]
for i in range(50):
    algo.learn(batches[i % 32], diagnostics=False)
t = time.perf_counter()
for i in range(p["updates"]):
    algo.learn(batches[i % 32], diagnostics=(i % 1000 == 999))
print(json.dumps({"ms": (time.perf_counter() - t) / p["updates"] * 1e3}))
"""

SB3_UPDATE = r"""
import json, sys, time
p = json.loads(sys.argv[1])
import gymnasium as gym, torch
from stable_baselines3 import SAC, TD3
from stable_baselines3.common.logger import configure
torch.set_num_threads(p["threads"])
kwargs = dict(p["kwargs"], learning_starts=0)
model = {"sac": SAC, "td3": TD3}[p["algo"]]("MlpPolicy", gym.make("Pendulum-v1"), seed=0,
                                            device="cpu", verbose=0, **kwargs)
model.learn(600)  # a few hundred transitions to sample from
model.set_logger(configure(None, [""]))
model.train(gradient_steps=50, batch_size=256)
t = time.perf_counter()
model.train(gradient_steps=p["updates"], batch_size=256)
print(json.dumps({"ms": (time.perf_counter() - t) / p["updates"] * 1e3}))
"""

# The matrix products of one update with each algorithm's shapes (batch 256, Pendulum's 3
# observations and 1 action): forward passes, weight gradients of what is trained and input
# gradients where the chain rule needs them. ``members`` = 2 for the twin critics. SAC: actor on
# obs and next_obs, both critics on (next_obs, a'), (obs, a) and (obs, pi); critic weights
# trained; the actor loss back through the critics' inputs (no critic weight gradients) into
# the actor. TD3 (policy delay 2): target actor and both critics every step; every other step
# the actor and Q1 alone (its loss uses only Q1).
FLOOR = r"""
import json, sys, time
import torch
p = json.loads(sys.argv[1])
torch.set_num_threads(p["threads"])
B, obs, act = 256, 3, 1
def dims(inp, hidden, out):
    return [inp, *hidden, out]
def forward(d, m, w=1.0):
    return [((m, B, d[i]), (m, d[i], d[i + 1]), w) for i in range(len(d) - 1)]
def weight_grads(d, m, w=1.0):
    return [((m, d[i], B), (m, B, d[i + 1]), w) for i in range(len(d) - 1)]
def input_grads(d, m, first, w=1.0):
    start = 0 if first else 1
    return [((m, B, d[i + 1]), (m, d[i + 1], d[i]), w) for i in range(start, len(d) - 1)]
if p["algo"] == "sac":
    a, q = dims(obs, [256, 256], 2 * act), dims(obs + act, [256, 256], 1)
    ops = (forward(a, 1) * 2 + forward(q, 2) * 3 + weight_grads(q, 2) + input_grads(q, 2, False)
           + input_grads(q, 2, True) + weight_grads(a, 1) + input_grads(a, 1, False))
else:
    a, q = dims(obs, [400, 300], act), dims(obs + act, [400, 300], 1)
    ops = (forward(a, 1) + forward(q, 2) * 2 + weight_grads(q, 2) + input_grads(q, 2, False)
           + forward(a, 1, 0.5) + forward(q, 1, 0.5) + input_grads(q, 1, True, 0.5)
           + weight_grads(a, 1, 0.5) + input_grads(a, 1, False, 0.5))
total = 0.0
for x_shape, y_shape, weight in ops:
    x, y = torch.randn(*x_shape), torch.randn(*y_shape)
    if x_shape[0] == 1:
        x, y = x[0].contiguous(), y[0].contiguous()
    mul = torch.bmm if x.dim() == 3 else torch.mm
    for _ in range(20):
        mul(x, y)
    n = 400
    t = time.perf_counter()
    for _ in range(n):
        mul(x, y)
    total += weight * (time.perf_counter() - t) / n
flops = sum(2 * w * x[0] * x[1] * x[2] * y[2] for x, y, w in ops)
print(json.dumps({"ms": total * 1e3, "gflop": flops / 1e9}))
"""


def per_update(args: argparse.Namespace) -> int:
    """Milliseconds per gradient step: harness, SB3 and the matrix-product floor."""
    kinds = {
        "harness": (sys.executable, HARNESS_UPDATE),
        "sb3": (args.sb3_python, SB3_UPDATE),
        "floor": (args.sb3_python, FLOOR),
    }
    results: dict[str, dict[str, list[float]]] = {a: {k: [] for k in kinds} for a in args.algos}
    for repeat in range(args.repeats):
        for algo in args.algos:
            order = list(kinds)[repeat % 3 :] + list(kinds)[: repeat % 3]
            for kind in order:
                python, script = kinds[kind]
                params = {
                    "algo": algo,
                    "threads": args.threads,
                    "updates": args.updates,
                    "kwargs": SB3_KWARGS[algo],
                }
                row = _run([python, "-c", script, json.dumps(params)])
                results[algo][kind].append(row["ms"])
                print(algo, repeat, kind, row, flush=True)
    print(
        "\n| algo | harness ms/update | SB3 ms/update | matmul floor ms | harness / SB3 "
        "| floor / SB3 | harness / floor |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for algo, r in results.items():
        h, s, f = (statistics.median(r[k]) for k in kinds)
        print(
            f"| {algo} | {h:.2f} | {s:.2f} | {f:.2f} | {h / s:.2f}x | {f / s:.2f}x | {h / f:.2f}x |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _run(cmd: list[str]) -> dict[str, float]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--algos", nargs="+", default=["sac", "td3"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sb3-python", default=str(ROOT / ".venv-bench" / "bin" / "python"))
    parser.add_argument("--out", default="/tmp/harness-bench-offpolicy")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--per-update",
        action="store_true",
        help="time one gradient step (harness, SB3, the matrix-product floor) instead",
    )
    parser.add_argument("--repeats", type=int, default=3, help="--per-update rounds")
    parser.add_argument("--updates", type=int, default=1000, help="--per-update steps timed")
    args = parser.parse_args()
    if args.per_update:
        return per_update(args)
    rows = []
    for algo in args.algos:
        for i, seed in enumerate(args.seeds):
            runs = {}
            order = ["harness", "sb3"] if i % 2 == 0 else ["sb3", "harness"]
            params = {
                "algo": algo,
                "seed": seed,
                "threads": args.threads,
                "out": args.out,
                "root": str(ROOT),
                "kwargs": SB3_KWARGS[algo],
                "threshold": THRESHOLD,
                "budget": BUDGET,
                "eval_every": EVAL_EVERY,
                "episodes": EVAL_EPISODES,
            }
            for who in order:
                python, script = (
                    (sys.executable, HARNESS) if who == "harness" else (args.sb3_python, SB3)
                )
                cmd = [python, "-c", script, json.dumps(params)]
                runs[who] = _run(cmd)
                print(algo, seed, who, runs[who], flush=True)
            rows.append({"algo": algo, "seed": seed, **runs})
    print("\n| algo | seed | harness steps | harness s | SB3 steps | SB3 s | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    summary = {}
    for r in rows:
        h, s = r["harness"], r["sb3"]
        print(
            f"| {r['algo']} | {r['seed']} | {h['steps']:,} | {h['seconds']:.1f} | "
            f"{s['steps']:,} | {s['seconds']:.1f} | {h['seconds'] / s['seconds']:.2f}x |"
        )
    for algo in args.algos:
        mine = [r for r in rows if r["algo"] == algo]
        h = statistics.median(r["harness"]["seconds"] for r in mine)
        s = statistics.median(r["sb3"]["seconds"] for r in mine)
        # the seeds' runs of the two libraries are independent draws, so the ratio of the two
        # medians compares the distributions; the median of the per-seed ratios is printed too
        paired = statistics.median(r["harness"]["seconds"] / r["sb3"]["seconds"] for r in mine)
        summary[algo] = {
            "harness_median_s": h,
            "sb3_median_s": s,
            "ratio": h / s,
            "median_seed_ratio": paired,
        }
        print(
            f"| {algo} | median | | {h:.1f} | | {s:.1f} | {h / s:.2f}x "
            f"(median of the seeds' ratios {paired:.2f}x) |"
        )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
