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
   the MP4 written into ffmpeg (libx264 ``superfast``, in its own process), the GIF and the
   filmstrip of the first episode; once per ``--widths`` value (``--video-width``; 0: the
   rendered size);
4. with ``--null-sink``, **null-sink**: the same recorder writing into ``cat > /dev/null``
   instead of ffmpeg (the recorder's own cost; the difference to **video** is the encoder's).

Reported per env and film: the median seconds of each, and the medians of the per-round
ratios ``video / render`` (what recording adds beyond the env's renderer) and ``video /
plain`` (the issue's figure for Atari; for CartPole, whose plain evaluation draws nothing,
``video / render`` is the meaningful one). Each round runs every variant once, the order
rotated; the dev VM's speed drifts by +-20% over minutes, so ratios within a round are
steadier than ratios of medians. A smoke run on a shared machine means nothing; the lead's
numbers go into docs/benchmarks.md.

    .venv/bin/python tools/bench_video.py [--envs CartPole-v1 ALE/Pong-v5] [--episodes 3]
        [--steps 20000] [--repeats 7] [--widths 0,300]
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


def bench(env_id: str, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    from harness import video
    from harness.commands import _load_plugins, checkpoint_config
    from harness.runtime import evaluate, load_agent
    from harness.video import EpisodeRecorder

    real_pipe = video.FfmpegPipe

    class NullPipe(real_pipe):  # type: ignore[misc, valid-type]
        """The same pipe, frames and backlog, read by ``cat`` into /dev/null: the recorder's
        own cost without an encoder."""

        def __init__(self, exe: str, path: Path, *rest: Any) -> None:
            path.write_bytes(b"")
            cat = Path(out) / "null-sink"
            cat.write_text("#!/bin/sh\nexec cat > /dev/null\n")
            cat.chmod(0o755)
            super().__init__(str(cat), path, *rest)

    run_dir = trained(env_id, args.steps, out)
    _, registry = _load_plugins([], [])
    config, ckpt = checkpoint_config(run_dir, [], registry)
    agent = load_agent(config, registry, ckpt)
    widths = [int(w) for w in args.widths.split(",")]
    films = [f"video@{w}" if w else "video" for w in widths]
    if args.null_sink:
        films.append("null-sink")
        widths.append(0)
    names = ["plain", "render", *films]
    times: dict[str, list[float]] = {name: [] for name in names}
    shapes: dict[str, Any] = {}
    frames, steps = 0, 0
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]  # (each first in turn)
        for what in order:
            t = time.perf_counter()
            if what == "plain":
                evaluate(agent, config, registry, args.episodes, seed=args.seed, max_envs=1)
            elif what == "render":
                only: Any = RenderOnly()
                evaluate(agent, config, registry, args.episodes, seed=args.seed, recorder=only)
            else:
                width = widths[films.index(what)] or None
                video.FfmpegPipe = NullPipe if what == "null-sink" else real_pipe  # type: ignore[misc, assignment]
                recorder = EpisodeRecorder(
                    out / "videos" / f"{run_dir.name}-{what}-{r}",
                    episodes=args.episodes,
                    env_id=env_id,
                    max_width=width,
                )
                result = evaluate(
                    agent, config, registry, args.episodes, seed=args.seed, recorder=recorder
                )
                files = recorder.close()
                frames = files.frames
                import imageio.v3 as iio

                assert files.mp4 is not None
                if what != "null-sink":
                    shapes[what] = iio.improps(files.mp4).shape[1:]
                steps = sum(result.lengths)
            times[what].append(time.perf_counter() - t)
    rows = []
    for film in films:
        # ratios within each round (the VM's speed drifts by +-20% over minutes: a ratio of
        # neighbouring runs is steadier than a ratio of medians)
        per_plain = [v / p for v, p in zip(times[film], times["plain"], strict=True)]
        per_render = [v / p for v, p in zip(times[film], times["render"], strict=True)]
        rows.append(
            {
                "env": env_id,
                "film": film,
                "plain": statistics.median(times["plain"]),
                "render": statistics.median(times["render"]),
                "video": statistics.median(times[film]),
                "steps": steps,
                "frames": frames,
                "shape": shapes.get(film, "-"),
                "video/render": statistics.median(per_render),
                "video/plain": statistics.median(per_plain),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "ALE/Pong-v5"])
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2048, help="training steps")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument(
        "--null-sink",
        action="store_true",
        help="also film into `cat > /dev/null` instead of ffmpeg (same pipe and frames): the "
        "recorder's own cost, without the encoder's",
    )
    parser.add_argument(
        "--widths",
        default="0",
        help="comma-separated --video-width values to film with (0: the rendered size)",
    )
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for env_id in args.envs:
            rows += bench(env_id, args, Path(tmp))
    print(f"\n`{shlex.join(['python', *sys.argv])}` ({args.repeats} rounds, medians)\n")
    print(
        "| env | film | steps | frames | MP4 frame (H, W, 3) | plain s | render s | video s |"
        " video / render | video / plain |"
    )
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['env']} | {r['film']} | {r['steps']} | {r['frames']} | {r['shape']} | "
            f"{r['plain']:.2f} | {r['render']:.2f} | {r['video']:.2f} | "
            f"{r['video/render']:.2f}x | {r['video/plain']:.2f}x |"
        )


if __name__ == "__main__":
    main()
