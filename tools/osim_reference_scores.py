"""Official-protocol scores of the reference policies of the OpenSim competition packs: the
uniform-random policy and the zero-activation policy (every excitation 0), what a trained
run is compared with in docs/competitions.md.

    python tools/osim_reference_scores.py --pack competitions/prosthetics --round 2 --episodes 10

Uses the same evaluation as ``harness eval RUN_DIR --protocol roundN`` (harness.runtime.run.evaluate
on the pack's envs with the round's own episode length), so the numbers are comparable with a
trained run's; prints one JSON line per policy.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from harness.config import find_pack_file, layer, resolve
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime import evaluate


class FixedPolicy:
    """What ``evaluate`` needs of an agent: ``predict(obs) -> actions``."""

    def __init__(self, kind: str, n_muscles: int, seed: int) -> None:
        self.kind = kind
        self.n = n_muscles
        self.rng = np.random.default_rng(seed)

    def predict(self, obs: np.ndarray) -> np.ndarray:
        shape = (len(obs), self.n)
        if self.kind == "zero":
            return np.zeros(shape, np.float32)
        return self.rng.uniform(0.0, 1.0, shape).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", default="competitions/prosthetics")
    parser.add_argument("--round", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=12345, help="as harness eval's default")
    parser.add_argument(
        "--frame-skip", type=int, default=1, help="simulator steps per action (1: per step)"
    )
    parser.add_argument("--policies", default="random,zero")
    args = parser.parse_args(argv)

    pm = make_plugin_manager()
    registry = collect_registry(pm)
    overrides = [
        f"env.round={args.round}",
        f"env.frame_skip={args.frame_skip}",
        "env.curriculum=[]",
        "env.step_deadline=0",
    ]
    raw = layer(find_pack_file(args.pack), [], overrides)
    raw.merge({"env": {"time_limit": None}}, "--round")  # the round's own episode length
    config = resolve(raw, registry)
    probe = registry.env_for(config.run.env).make_env(config.run.env, options=config.env)
    n_muscles = int(probe.single_action_space.shape[0])
    probe.close()
    for kind in args.policies.split(","):
        start = time.perf_counter()
        policy: Any = FixedPolicy(kind, n_muscles, args.seed)
        result = evaluate(policy, config, registry, args.episodes, seed=args.seed)
        row = {
            "pack": args.pack,
            "policy": kind,
            "round": args.round,
            "frame_skip": args.frame_skip,
            "episodes": len(result.returns),
            **{k: round(v, 3) for k, v in result.metric_means().items()},
            "score_std": round(float(np.std(result.metrics.get("score", [0.0]))), 3),
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
