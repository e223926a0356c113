"""Train every reference config in baselines/ over several seeds and record the results.

    .venv/bin/python tools/run_baselines.py [--seeds 1 2 3] [--only NAME]

For each ``baselines/NAME.toml`` (a pack reference plus overrides, see the files) this trains each
seed in-process, re-evaluates the final checkpoint on 20 fresh episodes, and writes
``baselines/results/NAME.json`` and ``baselines/results/NAME.png`` (evaluation curves per seed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from harness.checkpoint import latest_checkpoint
from harness.config import find_pack_file, layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import evaluate, train
from harness.runtime.run import load_agent

ROOT = Path(__file__).resolve().parents[1]


def run_one(spec: dict, seed: int, out: Path) -> dict:
    pm = make_plugin_manager()
    registry = collect_registry(pm)
    pack = find_pack_file(ROOT / spec["pack"])
    users = [ROOT / p for p in spec.get("configs", [])]
    overrides = [*spec.get("set", []), f"seed={seed}", f"out='{out}'", "trackers=['csv']"]
    config = resolve(layer(pack, users, overrides, environ={}), registry)
    result = train(config, registry, pm)
    agent = load_agent(config, registry, latest_checkpoint(result.run_dir))
    fresh = evaluate(agent, config, registry, 20, seed=777_000 + seed)
    state = json.loads((latest_checkpoint(result.run_dir) / "runner.json").read_text())
    return {
        "seed": seed,
        "steps": result.steps,
        "wall_time_s": round(result.wall_time, 1),
        "best_eval": result.best_eval,
        "fresh_eval_mean": fresh.mean,
        "fresh_eval_std": fresh.std,
        "eval_curve": state["eval_history"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--only", help="one baseline name")
    parser.add_argument("--out", default="/tmp/harness-baselines", help="run directories")
    args = parser.parse_args()
    results_dir = ROOT / "baselines" / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    for path in sorted((ROOT / "baselines").glob("*.toml")):
        if args.only and path.stem != args.only:
            continue
        spec = tomllib.loads(path.read_text())
        rows = [run_one(spec, seed, Path(args.out) / path.stem) for seed in args.seeds]
        record = {"name": path.stem, "spec": spec, "runs": rows}
        (results_dir / f"{path.stem}.json").write_text(json.dumps(record, indent=2))
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=110)
        for row in rows:
            xs, ys = zip(*row["eval_curve"], strict=True)
            ax.plot(xs, ys, "o-", label=f"seed {row['seed']}")
        ax.axhline(spec.get("threshold", 475), color="gray", ls="--", lw=1)
        ax.set(xlabel="env steps", ylabel="eval mean return (20 episodes)", title=path.stem)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(results_dir / f"{path.stem}.png")
        plt.close(fig)
        for row in rows:
            print(json.dumps({k: v for k, v in row.items() if k != "eval_curve"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
