"""Per-frame cost of the OpenSim gait renderer (harness_osim.render) beside the step it follows.

Runs one env of each family with render_mode="rgb_array" for --steps steps of uniform random
excitations (episodes restart when they end), timing per step: the env step, reading the frame's
state (gait_state: the state dictionary's bodies and OpenSim's muscle paths) and drawing it
(GaitRenderer.draw). Reports medians and 95th percentiles in ms and the render/step ratio.

    .venv/bin/python tools/bench_osim_render.py            # ~30 s
    .venv/bin/python tools/bench_osim_render.py --steps 50
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    from harness_osim.plugin import L2MConfig, ProstheticsConfig, make_one
    from harness_osim.render import gait_state

    for env_id, options in (
        ("Prosthetics-v0", ProstheticsConfig(round=2)),
        ("L2M2019-v0", L2MConfig()),
    ):
        env = make_one(env_id, options, "rgb_array")
        base = env.unwrapped
        env.reset(seed=0)
        env.render()  # builds the renderer (fonts, background): once per env
        renderer = base._renderer
        rng = np.random.default_rng(0)
        n = env.action_space.shape[0]
        step, state, draw = [], [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            _, _, term, trunc, _ = env.step(rng.uniform(0.0, 1.0, n))
            t1 = time.perf_counter()
            s = gait_state(base, renderer.skeleton)
            t2 = time.perf_counter()
            renderer.draw(s)
            t3 = time.perf_counter()
            step.append(t1 - t0)
            state.append(t2 - t1)
            draw.append(t3 - t2)
            if term or trunc:
                env.reset()
        ms = {k: np.array(v) * 1e3 for k, v in (("step", step), ("state", state), ("draw", draw))}
        total = ms["state"] + ms["draw"]
        print(f"{env_id} ({args.steps} steps)")
        for key, values in (*ms.items(), ("render", total)):
            median, p95 = np.median(values), np.percentile(values, 95)
            print(f"  {key:6s} median {median:6.2f} ms  p95 {p95:6.2f} ms")
        print(f"  render / step: {np.median(total) / np.median(ms['step']):.1%}")


if __name__ == "__main__":
    main()
