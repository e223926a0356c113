"""Record several baselines at once on a big machine (e.g. a lent GPU machine: 16 cores, one
GPU), one process per (baseline, seed), then merge the rows into baselines/results/ here.

    # on the big machine (each run capped at --max-seconds; rows land in OUT/rows/)
    python tools/device_baselines.py run mujoco_halfcheetah_sac mujoco_hopper_sac ... \
        --seeds 1 2 3 --max-seconds 420 --out $OUT
    # back here: baselines/results/NAME.json and NAME.png from the fetched rows
    .venv/bin/python tools/device_baselines.py merge FETCHED_DIR/rows

Each process runs exactly what ``harness baselines run NAME --seeds S`` runs (its
``run_seed``), with ``run.max_seconds`` added so everything ends inside the machine's time;
a run that hit the cap records the steps it reached (``"capped": true``). Baselines whose
config asks for the CPU (PPO) or CUDA (SAC/TD3: ``device = 'auto'``) get it as configured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_all(args: argparse.Namespace) -> int:
    rows_dir = args.out / "rows"
    rows_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for name in args.names:
        for seed in args.seeds:
            log = open(args.out / f"{name}.{seed}.log", "w")  # noqa: SIM115 - closed below
            cmd = [
                sys.executable,
                __file__,
                "one",
                name,
                str(seed),
                "--max-seconds",
                str(args.max_seconds),
                "--out",
                str(args.out),
            ]
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            procs.append((name, seed, subprocess.Popen(cmd, stdout=log, stderr=log, env=env), log))
    start = time.monotonic()
    failed = 0
    for name, seed, proc, log in procs:
        rc = proc.wait()
        log.close()
        failed += rc != 0
        print(f"{name} seed {seed}: exit {rc} at {time.monotonic() - start:.0f} s", flush=True)
    return 1 if failed else 0


def run_one(args: argparse.Namespace) -> int:
    from harness_competitions.baselines import run_seed

    spec = tomllib.loads((ROOT / "baselines" / f"{args.name}.toml").read_text())
    spec.setdefault("set", []).append(f"max_seconds={args.max_seconds}")
    row = run_seed(spec, ROOT, args.seed, args.out / "runs" / args.name)
    row["capped"] = row["steps"] < _budget(spec)
    out = args.out / "rows" / f"{args.name}.{args.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"name": args.name, "spec": spec, "row": row}) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k != "eval_curve"}), flush=True)
    return 0


def _budget(spec: dict) -> int:
    from harness.config import find_pack_file, layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager

    registry = collect_registry(make_plugin_manager())
    users = [ROOT / p for p in spec.get("configs", [])]
    layered = layer(find_pack_file(ROOT / spec["pack"]), users, spec.get("set", []), environ={})
    return resolve(layered, registry).run.total_steps


def merge(args: argparse.Namespace) -> int:
    from harness_competitions.baselines import _plot

    grouped: dict[str, tuple[dict, list[dict]]] = {}
    for path in sorted(args.rows.glob("*.json")):
        record = json.loads(path.read_text())
        spec = {k: v for k, v in record["spec"].items()}
        spec["set"] = [s for s in spec.get("set", []) if not s.startswith("max_seconds=")]
        grouped.setdefault(record["name"], (spec, []))[1].append(record["row"])
    results = ROOT / "baselines" / "results"
    results.mkdir(parents=True, exist_ok=True)
    for name, (spec, rows) in grouped.items():
        rows.sort(key=lambda r: r["seed"])
        record = {"name": name, "spec": spec, "runs": rows}
        (results / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
        _plot(name, spec, rows, results / f"{name}.png")
        print(name, [(r["seed"], r["steps"], round(r["fresh_eval_mean"], 1)) for r in rows])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("names", nargs="+")
    run.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    run.add_argument("--max-seconds", type=float, default=420)
    run.add_argument("--out", type=Path, required=True)
    one = sub.add_parser("one")
    one.add_argument("name")
    one.add_argument("seed", type=int)
    one.add_argument("--max-seconds", type=float, default=420)
    one.add_argument("--out", type=Path, required=True)
    mg = sub.add_parser("merge")
    mg.add_argument("rows", type=Path)
    args = parser.parse_args()
    return {"run": run_all, "one": run_one, "merge": merge}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
