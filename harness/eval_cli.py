"""``harness eval``: a checkpoint evaluated (optionally under a competition's protocol or
filmed), the result printed and appended to ``RUN/evaluations.jsonl``. Part of the
presentation layer (:mod:`harness.cli` parses the arguments and maps errors to exit codes)."""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.commands import _load_plugins, _plugin_flags, checkpoint_config
from harness.config import Config
from harness.errors import ConfigError, HarnessError
from harness.registry import EvalProtocol, Registry


def cmd_eval(args: argparse.Namespace) -> int:
    from harness.rundir import locked_for_writing, run_dir_of

    # it appends to RUN/evaluations.jsonl (and films into RUN/videos): one writer at a time,
    # and no checkpoint rotated away by a training run while it loads
    with locked_for_writing(run_dir_of(Path(args.checkpoint)), "harness eval"):
        return _evaluate_checkpoint(args)


def _evaluate_checkpoint(args: argparse.Namespace) -> int:
    from harness.rundir import check_checkpoint_files
    from harness.runtime import evaluate, load_agent

    _check_eval_flags(args)
    _pm, registry = _load_plugins(*_plugin_flags(args.plugins))
    config, ckpt, protocol = _eval_config(args, registry)
    default = protocol.episodes if protocol is not None else 3 if args.video else 20
    episodes = args.episodes or default
    check_checkpoint_files(ckpt)
    agent = load_agent(config, registry, ckpt)
    run_dir = ckpt.parent.parent  # (RUN/checkpoints/step_N)
    files, video_error = None, None
    if args.video:
        name = ckpt.name + (f"-{protocol.name}" if protocol is not None else "")
        try:
            files, result = _filmed_evaluation(
                agent, config, registry, episodes, args, run_dir / "videos" / name
            )
        except HarnessError as exc:  # the evaluation itself is not lost: run it without frames
            video_error = exc
    if files is None:
        result = evaluate(agent, config, registry, episodes, seed=args.seed)
    print(
        f"{config.run.algo} on {config.run.env} from {ckpt}: mean return {result.mean:.2f} "
        f"+/- {result.std:.2f} over {len(result.returns)} episodes "
        f"(mean length {sum(result.lengths) / max(1, len(result.lengths)):.1f})"
    )
    means = result.metric_means()
    if means:  # the env's episode metrics (a competition's official score, its fall rate)
        print("  " + ", ".join(f"{name} {value:.3f}" for name, value in sorted(means.items())))
    score = protocol.score_of(result.metrics) if protocol is not None else means.get("score")
    if protocol is not None:
        shown = "not reported by the env" if score is None else f"{score:.4f}"
        print(f"{protocol.description} ({len(result.returns)} episodes): score {shown}")
    if files is not None:
        for path in (files.mp4, files.gif, files.filmstrip):
            if path is not None:
                print(f"wrote {path}")
    record = {
        "config": config,
        "checkpoint": ckpt,
        "protocol": protocol.name if protocol is not None else None,
        "score": score,
    }
    _append_evaluation(run_dir, record, result, args, files)
    if video_error is not None:
        raise video_error
    return 0


def _eval_config(
    args: argparse.Namespace, registry: Registry
) -> tuple[Config, Path, EvalProtocol | None]:
    """The config ``harness eval`` evaluates with, its checkpoint and its protocol (None: the
    run's own env). ``--round N`` is the deprecated spelling of ``--protocol roundN`` (the
    OpenSim competitions' protocols, which their env plugin declares): the same protocol, one
    warning line once it is found."""
    name, flag = args.protocol, f"--protocol {args.protocol}"
    if args.round is not None:
        if args.protocol is not None:
            raise ConfigError("harness eval: give --round or --protocol, not both.")
        name, flag = f"round{args.round}", f"--round {args.round}"
    source = Path(args.checkpoint)
    config, ckpt = checkpoint_config(source, args.overrides, registry)
    if name is None:
        return config, ckpt, None
    protocol = registry.protocol(config.run.env, name, flag)
    if args.round is not None:
        print(
            f"harness: warning: --round is deprecated and will be removed in the next release; "
            f"use --protocol {name} (the same evaluation).",
            file=sys.stderr,
        )
    layer_ = protocol.config_layer(config.env)
    reset = sorted(set(layer_["env"]) - set(protocol.env_options))
    if reset:
        print(
            f"{flag} evaluates the challenge's own task: the run's [env] {', '.join(reset)} "
            f"set back"
        )
    config, ckpt = checkpoint_config(source, args.overrides, registry, extra=(layer_, flag))
    return config, ckpt, protocol


def _check_eval_flags(args: argparse.Namespace) -> None:
    """Refuse bad ``harness eval`` numbers before anything is loaded."""
    if args.episodes is not None and args.episodes < 1:
        raise ConfigError(f"--episodes {args.episodes}: evaluate 1 or more episodes.")
    if args.video_width is not None:
        if not args.video:
            raise ConfigError("--video-width sets the films' width: give --video too.")
        if args.video_width < 16:
            raise ConfigError(
                f"--video-width {args.video_width}: give a width of 16 pixels or more (e.g. "
                f"--video-width 320); leave it out for the rendered size."
            )
    if args.fps is not None:
        if not args.video:
            raise ConfigError("--fps sets the frame rate of the films: give --video too.")
        if not (math.isfinite(args.fps) and args.fps > 0):
            raise ConfigError(
                f"--fps {args.fps:g}: frames per second must be a number > 0 (e.g. --fps 30); "
                f"leave it out for the env's own rate."
            )


def _filmed_evaluation(
    agent: Any,
    config: Any,
    registry: Any,
    episodes: int,
    args: argparse.Namespace,
    base: Path,
) -> tuple[Any, Any]:
    """``evaluate`` on one rendering env with every episode filmed into ``base``.mp4 (+ .gif,
    -filmstrip.png); returns the files and the evaluation."""
    from harness.runtime import evaluate
    from harness.video import EpisodeRecorder

    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--video: cannot write the films to {base.parent}: {exc}.") from None
    recorder = EpisodeRecorder(
        base,
        episodes=episodes,
        fps=args.fps,
        env_id=config.run.env,
        max_width=args.video_width,
    )
    try:
        result = evaluate(agent, config, registry, episodes, seed=args.seed, recorder=recorder)
        return recorder.close(), result
    except BaseException:
        recorder.abort()
        raise


EVALUATIONS = "evaluations.jsonl"
"""The file of a run directory that every ``harness eval`` appends one JSON line to (what
``harness report`` tabulates)."""


def _append_evaluation(
    run_dir: Path,
    record: Mapping[str, Any],
    result: Any,
    args: argparse.Namespace,
    files: Any,
) -> None:
    """One line of ``RUN/evaluations.jsonl`` for this evaluation (a run directory that cannot
    be written is warned about, the evaluation stands)."""
    config, ckpt = record["config"], record["checkpoint"]

    def rel(path: Path | None) -> str | None:
        if path is None:
            return None
        try:
            return str(path.relative_to(run_dir))
        except ValueError:
            return str(path)

    def number(value: Any) -> float | None:
        return float(value) if value is not None and math.isfinite(value) else None

    found = re.fullmatch(r"step_(\d+)", ckpt.name)
    step = int(found.group(1)) if found else None
    if step is None:
        from harness.checkpoint import read_meta

        step = int(read_meta(ckpt).get("step", 0))
    line = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "checkpoint": rel(ckpt),
        "step": step,
        "env": config.run.env,
        "algo": config.run.algo,
        "protocol": record["protocol"],
        "episodes": len(result.returns),
        "seed": args.seed,
        "mean_return": number(result.mean),
        "std_return": number(result.std),
        "returns": [float(r) for r in result.returns],
        "lengths": [int(n) for n in result.lengths],
        "metrics": {k: number(v) for k, v in sorted(result.metric_means().items())},
        "score": number(record["score"]),
        "video": rel(files.mp4) if files is not None else None,
        "gif": rel(files.gif) if files is not None else None,
        "filmstrip": rel(files.filmstrip) if files is not None else None,
        "command": shlex.join(["harness", *args.argv]),
    }
    try:
        with open(run_dir / EVALUATIONS, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    except OSError as exc:
        print(
            f"harness: warning: could not record the evaluation in {run_dir / EVALUATIONS}: {exc}",
            file=sys.stderr,
        )
