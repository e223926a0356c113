"""``harness baselines``: reproduce the reference results in a checkout's ``baselines/``.

Each ``baselines/NAME.toml`` names a pack plus user files and overrides, the seeds to record
and the return threshold. ``harness baselines run NAME`` trains every seed in-process until a
periodic greedy evaluation reaches the pack's ``stop_at_return`` (or the budget runs out),
re-evaluates the final checkpoint on 20 fresh episodes with other env seeds, and writes
``baselines/results/NAME.json`` (per seed: steps, steps to the threshold, wall-clock, fresh
evaluation with the env's episode metrics, the evaluation curve, and where the file names a
``protocol``, the competition's official evaluation of the final checkpoint and its score)
and ``baselines/results/NAME.png`` (the curves).
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, did_you_mean

FRESH_EPISODES = 20
DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="baselines_command", required=True)
    run = sub.add_parser("run", help="train and record one or more baselines")
    run.add_argument("names", nargs="*", metavar="NAME", help="baselines to run (default: all)")
    run.add_argument("--seeds", type=int, nargs="+", help="override the file's seeds")
    run.add_argument(
        "--dir", type=Path, default=Path("baselines"), help="baselines directory (./baselines)"
    )
    run.add_argument(
        "--out", type=Path, default=Path("/tmp/harness-baselines"), help="run directories"
    )
    ls = sub.add_parser("list", help="list the baselines and their recorded results")
    ls.add_argument("--dir", type=Path, default=Path("baselines"))
    table = sub.add_parser("table", help="the recorded results as a markdown table")
    table.add_argument("--dir", type=Path, default=Path("baselines"))


def _specs(directory: Path) -> dict[str, dict[str, Any]]:
    if not directory.is_dir():
        raise ConfigError(
            f"{directory} is not a directory. Run from a harness checkout (where baselines/ "
            f"is) or pass --dir."
        )
    specs = {}
    for path in sorted(directory.glob("*.toml")):
        try:
            specs[path.stem] = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        if "pack" not in specs[path.stem]:
            raise ConfigError(f"{path} has no 'pack' key (e.g. pack = 'competitions/cartpole').")
    return specs


def run(args: argparse.Namespace) -> int:
    specs = _specs(args.dir)
    if args.baselines_command == "list":
        for name, spec in specs.items():
            recorded = args.dir / "results" / f"{name}.json"
            state = "recorded" if recorded.is_file() else "not recorded"
            print(f"{name:24s} {spec['pack']:28s} threshold {spec.get('threshold')}  ({state})")
        return 0
    if args.baselines_command == "table":
        print(markdown_table(specs, args.dir / "results"))
        return 0
    names = args.names or list(specs)
    for name in names:
        if name not in specs:
            raise ConfigError(f"No baseline {name!r} in {args.dir}.{did_you_mean(name, specs)}")
    for name in names:
        record_baseline(name, specs[name], args.dir, args.out, args.seeds)
    return 0


def run_seed(spec: dict[str, Any], root: Path, seed: int, out: Path) -> dict[str, Any]:
    """Train one seed of ``spec`` and re-evaluate its final checkpoint on fresh episodes."""
    from harness.checkpoint import latest_checkpoint
    from harness.config import find_pack_file, layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager
    from harness.runtime import evaluate, load_agent, train
    from harness.seeds import Seeds

    pm = make_plugin_manager()
    registry = collect_registry(pm)
    pack = find_pack_file(root / spec["pack"])
    users = [root / p for p in spec.get("configs", [])]
    overrides = [*spec.get("set", []), f"seed={seed}", f"out='{out}'", "trackers=['csv']"]
    config = resolve(layer(pack, users, overrides, environ={}), registry)
    result = train(config, registry, pm)
    ckpt = latest_checkpoint(result.run_dir)
    agent = load_agent(config, registry, ckpt)
    # (the evaluation streams of the final step, told apart from training's by a second key)
    seeds, last = Seeds(seed), config.run.total_steps
    fresh = evaluate(
        agent, config, registry, FRESH_EPISODES, seed=seeds.seed("evaluation", last, 1)
    )
    curve = json.loads((ckpt / "runner.json").read_text(encoding="utf-8"))["eval_history"]
    threshold = spec.get("threshold")
    reached = [s for s, r in curve if threshold is not None and r >= threshold]
    extra: dict[str, Any] = {"fresh_eval_metrics": fresh.metric_means()}
    if "protocol" in spec:  # a competition's official evaluation of the final checkpoint
        name = spec["protocol"]
        protocol = registry.protocol(config.run.env, name)
        raw = layer(pack, users, overrides, environ={})
        raw.merge(protocol.config_layer(config.env), f"protocol {name}")
        official = resolve(raw, registry)
        done = evaluate(
            agent, official, registry, protocol.episodes, seed=seeds.seed("evaluation", last, 2)
        )
        extra["protocol"] = {
            "name": name,
            "env": official.run.env,
            "episodes": protocol.episodes,
            "score": protocol.score_of(done.metrics),
            "metrics": done.metric_means(),
        }
    return {
        "seed": seed,
        "steps": result.steps,
        "steps_to_threshold": reached[0] if reached else None,
        "wall_time_s": round(result.wall_time, 1),
        "best_eval": result.best_eval,
        "fresh_eval_mean": fresh.mean,
        "fresh_eval_std": fresh.std,
        "eval_curve": curve,
        **extra,
    }


def record_baseline(
    name: str, spec: dict[str, Any], directory: Path, out: Path, seeds: list[int] | None
) -> None:
    root = directory.resolve().parent  # pack paths in the files are relative to the checkout
    rows = []
    for seed in seeds or spec.get("seeds", [1, 2, 3]):
        row = run_seed(spec, root, seed, out / name)
        print(json.dumps({k: v for k, v in row.items() if k != "eval_curve"}), flush=True)
        rows.append(row)
    results = directory / "results"
    results.mkdir(parents=True, exist_ok=True)
    record = {"name": name, "spec": spec, "runs": rows}
    (results / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    _plot(name, spec, rows, results / f"{name}.png")


def _plot(name: str, spec: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=110)
    for row in rows:
        if row["eval_curve"]:
            xs, ys = zip(*row["eval_curve"], strict=True)
            ax.plot(xs, ys, "o-", ms=3, label=f"seed {row['seed']}")
    if spec.get("threshold") is not None:
        ax.axhline(spec["threshold"], color="gray", ls="--", lw=1)
    ax.set(xlabel="env steps", ylabel="greedy eval mean return", title=name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def markdown_table(specs: dict[str, dict[str, Any]], results: Path) -> str:
    """One row per recorded seed: budget, steps to the threshold, fresh evaluation, time."""
    lines = [
        "| baseline | seed | steps run | steps to threshold | fresh eval (20 ep.) | score (20 ep.) "
        "| official protocol | wall-clock |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for name in specs:
        path = results / f"{name}.json"
        if not path.is_file():
            continue
        for row in json.loads(path.read_text(encoding="utf-8"))["runs"]:
            reached = row.get("steps_to_threshold")
            capped = " (time cap)" if row.get("capped") else ""
            score = row.get("fresh_eval_metrics", {}).get("score")
            protocol = row.get("protocol")
            official = (
                f"{protocol['score']:.3f} ({protocol['name']}: {protocol['env']}, "
                f"{protocol['episodes']} ep.)"
                if protocol and protocol.get("score") is not None
                else "-"
            )
            lines.append(
                f"| {name} | {row['seed']} | {row['steps']:,}{capped} | "
                f"{f'{reached:,}' if reached is not None else '-'} | "
                f"{row['fresh_eval_mean']:.1f} ± {row['fresh_eval_std']:.1f} | "
                f"{'-' if score is None else f'{score:.3f}'} | {official} | "
                f"{row['wall_time_s']:.0f} s |"
            )
    return "\n".join(lines)
