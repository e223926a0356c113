"""What filming an evaluation costs (``harness eval --video``), against the env's own renderer.

Issue 31's target: recording adds <= 20% to an evaluation of Atari / classic control. For each
env of ``--envs`` (default CartPole-v1 and ALE/Pong-v5), one run trains a short checkpoint
(``--steps``, PPO; CartPole's pack, Pong with the CartPole pack's PPO on ALE/Pong-v5's Atari
preprocessing) and then times, ``--repeats`` rounds in turn, the same ``--episodes`` greedy
episodes from the same seed on ONE env (as a filmed evaluation runs them):

1. **plain**: ``harness.runtime.run.evaluate(..., max_envs=1)``, no frames;
2. **render**: the same with the env made with ``render_mode="rgb_array"`` and ``render()``
   called after the reset and every step, the frames dropped: the env's renderer alone (the
   limit: recording cannot cost less than making the frames);
3. **video**: ``harness.video.EpisodeRecorder`` as ``harness eval --video`` uses it: captions,
   the MP4 streamed into ffmpeg (libx264 ``veryfast``, in its own process), the GIF and the
   filmstrip of the first episode.

Reported per env: the median seconds of each, ``video / render`` (what recording adds beyond
the env's renderer: the issue's figure) and ``video / plain``, frames and frame size. A smoke
run on a shared machine is noisy; the lead's numbers go into docs/benchmarks.md.

    .venv/bin/python tools/bench_video.py [--envs CartPole-v1 ALE/Pong-v5] [--episodes 3]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class RenderOnly:
    """A recorder that makes every frame a filmed evaluation makes and keeps none."""

    def __init__(self) -> None:
        self.frames = 0

    def start(self, envs: Any) -> None:
        envs.render()
        self.frames += 1

    def after_step(self, envs: Any, reward: float, ended: bool, infos: Any, metrics: Any) -> None:
        envs.render()  # (after an ending step: the next episode's first frame)
        self.frames += 1


def trained(env_id: str, steps: int, out: Path) -> Path:
    from harness.cli import main

    name = env_id.replace("/", "_")
    args = ["run", str(ROOT / "competitions" / "cartpole"), "--steps", str(steps)]
    args += ["--out", str(out), "--no-progress", "--set", f"name={name}"]
    args += ["--set", f"env={env_id}", "--set", "eval_episodes=0", "--set", "trackers=['csv']"]
    if env_id.startswith("ALE/"):  # whole games would take minutes per episode untrained
        args += ["--set", "env.max_episode_steps=400", "--set", "env.episodic_life=false"]
    if main(args) != 0:
        raise SystemExit(f"training {env_id} failed")
    return out / name


def bench(env_id: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from harness.commands import _load_plugins, checkpoint_config
    from harness.runtime.run import evaluate, load_agent
    from harness.video import EpisodeRecorder

    run_dir = trained(env_id, args.steps, out)
    _, registry = _load_plugins([], [])
    config, ckpt = checkpoint_config(run_dir, [], registry)
    agent = load_agent(config, registry, ckpt)
    times: dict[str, list[float]] = {"plain": [], "render": [], "video": []}
    frames, shape = 0, None
    for r in range(args.repeats):
        order = ["plain", "render", "video"]
        order = order[r % 3 :] + order[: r % 3]
        for what in order:
            t = time.perf_counter()
            if what == "plain":
                evaluate(agent, config, registry, args.episodes, seed=args.seed, max_envs=1)
            elif what == "render":
                evaluate(
                    agent, config, registry, args.episodes, seed=args.seed, recorder=RenderOnly()
                )  # type: ignore[arg-type]
            else:
                recorder = EpisodeRecorder(
                    out / "videos" / f"{run_dir.name}-{r}", episodes=args.episodes, env_id=env_id
                )
                result = evaluate(
                    agent, config, registry, args.episodes, seed=args.seed, recorder=recorder
                )
                files = recorder.close()
                frames = files.frames
                import imageio.v3 as iio

                assert files.mp4 is not None
                shape = iio.improps(files.mp4).shape[1:]
                steps = sum(result.lengths)
            times[what].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "env": env_id,
        **med,
        "steps": steps,
        "frames": frames,
        "shape": shape,
        "video/render": med["video"] / med["render"],
        "video/plain": med["video"] / med["plain"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "ALE/Pong-v5"])
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2048, help="training steps")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for env_id in args.envs:
            rows.append(bench(env_id, args, Path(tmp)))
    print(f"\n`{shlex.join(['python', *sys.argv])}` ({args.repeats} rounds, medians)\n")
    print(
        "| env | steps | frames | frame (H, W, 3) | plain s | render s | video s |"
        " video / render | video / plain |"
    )
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['env']} | {r['steps']} | {r['frames']} | {r['shape']} | {r['plain']:.2f} | "
            f"{r['render']:.2f} | {r['video']:.2f} | {r['video/render']:.2f}x | "
            f"{r['video/plain']:.2f}x |"
        )


if __name__ == "__main__":
    main()
