"""Time to the Pendulum-v1 threshold: harness's SAC and TD3 against Stable-Baselines3's with
the same hyper-parameters (the RL Zoo's Pendulum entries, competitions/pendulum), same machine,
same run, same torch thread count.

    .venv/bin/python tools/bench_offpolicy.py [--algos sac td3] [--seeds 1 2 3] \
        [--threads 1] [--sb3-python .venv-bench/bin/python] [--json out.json]

Each (algorithm, seed) trains once with harness and once with SB3 (the order alternates per
seed, so drift on a shared VM hits both alike), each in a fresh process, each evaluating
greedily on 10 episodes every 1,000 env steps and stopping at the first mean >= -200 (or the
20k budget). Reported: env steps and wall-clock (process start to stop, including its
evaluations; imports excluded) to the threshold, and the ratio harness / SB3 per seed and of
the medians. SB3 lives in its own venv (.venv-bench: `pip install stable-baselines3`).
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
    args = parser.parse_args()
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
        summary[algo] = {"harness_median_s": h, "sb3_median_s": s, "ratio": h / s}
        print(f"| {algo} | median | | {h:.1f} | | {s:.1f} | {h / s:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
