"""Training frames/s on Pong: harness IMPALA (per-actor and central inference) against Sample
Factory 2.1.1's APPO, on the same machine, in one run.

Three measurements, in this order (then SF once more, ``--sf-after``, averaged with the first:
on a shared machine the load drifts between windows):

- **Sample Factory APPO** (``sf_examples.atari.train_atari``, run as a subprocess of its own
  venv, ``bash tools/bench_sf.sh`` builds it): ``--async_rl`` with the PPO-clip loss
  (``--with_vtrace False``: its V-trace path fails on 2.1.1), ``--workers`` rollout workers x
  ``--envs-per-worker`` envs, double-buffered sampling (``worker_num_splits 2``, SF's
  throughput setting), its CPU learner (``--sf-device gpu`` on a GPU machine). Its training
  frames/s is the change of its own "Total num frames" (frames the learner trained on,
  frame-skip included: ``summaries_use_frameskip``) between two of its 5-second reports,
  the first ``--warmup`` s after the first trained batch, the second ``--seconds`` later.
- **harness IMPALA, per-actor acting** and **central inference** (``run.inference`` =
  ``actor`` / ``central``): ``tools/bench_impala.py``'s embedded farm of ``--workers``
  actors x ``--envs-per-worker`` envs, with real V-trace updates (``--learner update``):
  the frames the learner observed over its window.

Frames are emulator frames (agent steps x the frame skip of 4) on both sides.

The same network on both sides: the Nature CNN (32x8x8/4, 64x4x4/2, 64x3x3/1, ReLU, a
512-unit ReLU layer; harness IMPALA ``cnn = "nature"``, SF ``convnet_atari`` with
``encoder_conv_mlp_layers [512]``) and two linear heads (policy logits and value) on the
shared trunk; observations scaled by 1/255, SF's input and return normalisation off.

The env (``--sf-env``): ``matched`` (default) gives SF the same per-step work as harness's
DeepMind preprocessing: ALE's grayscale screen (``obs_type="grayscale"``), gymnasium's
``AtariPreprocessing`` (noop reset, skip 4 with a max-pool of the last two frames, 84x84,
episodic life), a 4-frame stack; ``stock`` is SF's own Atari wrappers (RGB screens resized,
then converted to grey: more work per step). Both are measured first as plain env loops (one
process, ``--envs-per-worker`` envs, random actions) beside harness's, so the env's share of
any difference shows. What still differs is listed at the end of the output.

The training settings (``--sf-preset``): ``matched`` (default) gives SF harness IMPALA's
work per sample (rollouts of 20 steps, one gradient step per batch of 20 steps x all the
envs, 160 samples at 2 x 4, one pass over each sample); ``atari`` is SF's Atari example
defaults (rollouts of 128, 4 epochs x 4 minibatches of 256: four gradient passes per sample).

    bash tools/bench_sf.sh                                     # once: builds .venv-sf
    .venv/bin/python tools/bench_sf.py                         # 60 s windows, ~8 min
    .venv/bin/python tools/bench_sf.py --seconds 30 --no-sf-after   # smoke
    .venv/bin/python tools/bench_sf.py --sf-preset matched,atari --sf-env matched,stock
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_impala, as a sibling

FRAME_SKIP = 4

PRESETS = ("matched", "atari")


def preset_flags(preset: str, envs: int) -> list[str]:
    """``matched``: harness IMPALA's work per sample, one gradient step per batch of 20 steps
    x every env, one pass; ``atari``: sf_examples.atari's defaults (rollout 128, 4 epochs x 4
    batches of 256)."""
    if preset == "atari":
        return []
    return [
        "--rollout=20",
        f"--batch_size={20 * envs}",
        "--num_batches_per_epoch=1",
        "--num_epochs=1",
    ]


# Written next to SF's train_dir and run from SF's venv: its env factory must be a module-level
# function (SF pickles the env registry into its spawned workers). ale-py >= 0.9 (the one with
# cp312 wheels, for a GPU machine's Python) registers the ids on import, 0.8.1 through shimmy.
LAUNCHER = '''
import random
import sys
import time

import gymnasium as gym
from sample_factory.envs.env_utils import register_env
from sample_factory.envs.env_wrappers import NumpyObsWrapper
from sample_factory.train import run_rl
from sf_examples.atari.atari_utils import make_atari_env
from sf_examples.atari.train_atari import parse_atari_args

try:
    import ale_py  # noqa: F401
except ImportError:
    pass


def make_matched(env_name, cfg, env_config, render_mode=None):
    """The per-step work of harness's DeepMind preprocessing (ALE grayscale, skip 4 with a
    max-pool, 84x84, noop reset, episodic life, 4 stacked frames)."""
    env = gym.make("PongNoFrameskip-v4", obs_type="grayscale", render_mode=render_mode)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=30, frame_skip=cfg.env_frameskip, screen_size=84,
        terminal_on_life_loss=True, grayscale_obs=True, scale_obs=False,
    )
    env = gym.wrappers.FrameStack(env, cfg.env_framestack)
    return NumpyObsWrapper(env)


def make_stock(env_name, cfg, env_config, render_mode=None):
    return make_atari_env("atari_pong", cfg, env_config, render_mode)


def env_loop(kind, seconds, k):
    """Agent steps/s of k envs stepped in turn with random actions, one process."""
    cfg = parse_atari_args(["--env=atari_pong", "--experiment=envcheck"])
    make = make_matched if kind == "matched" else make_stock
    envs = [make("atari_pong", cfg, None) for _ in range(k)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    n = envs[0].action_space.n
    steps, end = 0, time.perf_counter() + seconds
    t0 = time.perf_counter()
    while time.perf_counter() < end:
        for env in envs:
            _, _, term, trunc, _ = env.step(random.randrange(n))
            if term or trunc:
                env.reset()
        steps += k
    print(f"ENVLOOP {steps / (time.perf_counter() - t0):.3f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "envloop":
        env_loop(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
        sys.exit(0)
    register_env("atari_pong", make_matched if sys.argv[1] == "matched" else make_stock)
    sys.exit(run_rl(parse_atari_args(sys.argv[2:])))
'''

ANSI = re.compile(r"\x1b\[[0-9;]*m")
REPORT = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[\d+\] Fps is .*?Total num frames: (\d+)\."
    r".*?Samples: (\d+)\."
)


@dataclass
class SFResult:
    """One SF run: trained frames/s over the window, the window's length and SF's own last
    report line."""

    label: str
    train_fps: float = float("nan")
    window_s: float = 0.0
    last_report: str = ""
    error: str = ""
    log: list[str] = field(default_factory=list)


def sf_env(args: argparse.Namespace) -> dict[str, str]:
    """SF's environment: ``SF_PYTHONPATH`` (a GPU machine's wheels, tools/gpu_check.sh) in
    front, nothing of harness's venv; torch threads as SF sets them itself."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"
    extra = [p for p in (os.environ.get("SF_PYTHONPATH", ""), str(args.tmp)) if p]
    env["PYTHONPATH"] = os.pathsep.join(extra)
    return env


def sf_command(args: argparse.Namespace, env_kind: str, preset: str, train_dir: Path) -> list[str]:
    return [
        args.sf_python,
        "-m",
        "sf_bench_launcher",
        env_kind,
        "--env=atari_pong",
        f"--experiment=bench_{env_kind}_{preset}",
        f"--train_dir={train_dir}",
        "--restart_behavior=overwrite",
        f"--num_workers={args.workers}",
        f"--num_envs_per_worker={args.envs_per_worker}",
        "--worker_num_splits=2",
        f"--device={args.sf_device}",
        "--async_rl=True",
        "--with_vtrace=False",
        "--normalize_input=False",
        "--normalize_returns=False",
        "--encoder_conv_architecture=convnet_atari",
        "--encoder_conv_mlp_layers",
        "512",
        "--nonlinearity=relu",
        "--use_rnn=False",
        "--save_every_sec=100000",
        "--save_best_every_sec=100000",
        "--with_wandb=False",
        "--train_for_env_steps=10000000000",
        *preset_flags(preset, args.workers * args.envs_per_worker),
        *args.sf_arg,
    ]


def run_sf(args: argparse.Namespace, env_kind: str, preset: str, label: str) -> SFResult:
    """One SF training run, stopped once its window closed (or at the deadline)."""
    result = SFResult(label)
    train_dir = args.tmp / f"train_{label.replace(' ', '_')}"
    cmd = sf_command(args, env_kind, preset, train_dir)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=sf_env(args),
        start_new_session=True,  # SF's workers share its process group: stopped together
    )
    reports: list[tuple[float, int, int, str]] = []
    lock = threading.Lock()

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = ANSI.sub("", raw.rstrip())
            result.log.append(line)
            m = REPORT.search(line)
            if m:
                ts = dt.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                with lock:
                    reports.append((ts, int(m[2]), int(m[3]), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + args.sf_timeout
    window: tuple[tuple[float, int, int, str], tuple[float, int, int, str]] | None = None
    while time.monotonic() < deadline and proc.poll() is None and window is None:
        time.sleep(1.0)
        with lock:
            window = _window(reports, args.warmup, args.seconds)
    _stop(proc)
    reader.join(timeout=10)
    if window is None:
        tail = "\n".join(result.log[-15:])
        result.error = (
            f"no window: SF exited {proc.returncode}"
            if proc.returncode not in (None, 0, -15)
            else "no window before --sf-timeout"
        ) + f"; last lines:\n{tail}"
        return result
    (t0, f0, _, _), (t1, f1, _, line) = window
    result.window_s = t1 - t0
    result.train_fps = (f1 - f0) / (t1 - t0)
    result.last_report = line.split("] ", 1)[-1]
    return result


def _window(
    reports: list[tuple[float, int, int, str]], warmup: float, seconds: float
) -> tuple[tuple[float, int, int, str], tuple[float, int, int, str]] | None:
    """The report ``warmup`` s after the first trained batch and the one ``seconds`` later."""
    trained = [r for r in reports if r[1] > 0]
    if not trained:
        return None
    start = next((r for r in trained if r[0] >= trained[0][0] + warmup), None)
    if start is None:
        return None
    end = next((r for r in trained if r[0] >= start[0] + seconds), None)
    return (start, end) if end is not None else None


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to SF's whole process group, SIGKILL what is left after 20 s."""
    for sig, wait in ((signal.SIGINT, 15), (signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # spawned workers outliving the main one
        os.killpg(proc.pid, signal.SIGKILL)


def sf_env_loop(args: argparse.Namespace, kind: str) -> float:
    """Frames/s of SF's env (``kind``) stepped alone: one process, random actions."""
    out = subprocess.run(
        [args.sf_python, "-m", "sf_bench_launcher", "envloop", kind, str(args.env_seconds),
         str(args.envs_per_worker)],
        capture_output=True, text=True, env=sf_env(args), timeout=args.env_seconds + 120,
    )  # fmt: skip
    m = re.search(r"ENVLOOP ([0-9.]+)", out.stdout)
    if not m:
        raise RuntimeError(
            f"SF env loop ({kind}) failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
        )
    return float(m[1]) * FRAME_SKIP


def impala_args(args: argparse.Namespace) -> argparse.Namespace:
    """bench_impala.py's options for its embedded farm, from ours."""
    return argparse.Namespace(
        env="ALE/Pong-v5",
        actors=args.workers,
        envs_per_actor=args.envs_per_worker,
        seconds=args.seconds,
        warmup=args.warmup,
        rollout=20,
        lag=args.lag,
        cnn="nature",
        learner="update",
        int8=False,
        inference="actor,central",
        policy_cost=False,
    )


def fmt(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:,.0f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="each measuring window")
    p.add_argument("--warmup", type=float, default=10.0, help="after the first trained batch")
    p.add_argument("--workers", type=int, default=2, help="SF rollout workers = harness actors")
    p.add_argument("--envs-per-worker", type=int, default=4)
    p.add_argument("--lag", type=int, default=2, help="harness run.max_policy_lag")
    p.add_argument("--inference", default="actor,central", help="harness run.inference modes")
    p.add_argument("--sf-python", default=str(ROOT / ".venv-sf" / "bin" / "python"))
    p.add_argument("--sf-device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--sf-env", default="matched", help="matched and/or stock, comma-separated")
    p.add_argument("--sf-preset", default="matched", help="matched and/or atari")
    p.add_argument("--sf-arg", action="append", default=[], help="extra SF flag (repeatable)")
    p.add_argument("--sf-after", action=argparse.BooleanOptionalAction, default=True,
                   help="run SF again after harness and average the two")  # fmt: skip
    p.add_argument("--sf-timeout", type=float, default=0.0, help="per SF run (0: auto)")
    p.add_argument("--env-seconds", type=float, default=5.0, help="plain env loops (0: skip)")
    p.add_argument("--keep", type=Path, help="write SF's logs into this folder")
    args = p.parse_args(argv)
    if not Path(args.sf_python).exists() and shutil.which(args.sf_python) is None:
        print(f"bench_sf: no {args.sf_python}: run `bash tools/bench_sf.sh` first (or pass "
              "--sf-python)", file=sys.stderr)  # fmt: skip
        return 2
    args.sf_timeout = args.sf_timeout or args.seconds + args.warmup + 240
    envs = [e for e in args.sf_env.split(",") if e]
    presets = [q for q in args.sf_preset.split(",") if q]
    bad = [e for e in envs if e not in ("matched", "stock")] + [
        q for q in presets if q not in PRESETS
    ]
    if bad:
        print(f"bench_sf: unknown --sf-env/--sf-preset value(s) {bad}", file=sys.stderr)
        return 2
    args.tmp = Path(tempfile.mkdtemp(prefix="bench_sf_"))
    (args.tmp / "sf_bench_launcher.py").write_text(LAUNCHER)
    try:
        return _run(args, argv, envs, presets)
    finally:
        shutil.rmtree(args.tmp, ignore_errors=True)


def _run(
    args: argparse.Namespace, argv: list[str] | None, envs: list[str], presets: list[str]
) -> int:
    import bench_impala

    load0 = os.getloadavg()
    loops: dict[str, float] = {}
    if args.env_seconds > 0:
        one = argparse.Namespace(**{**vars(impala_args(args)), "actors": 1,
                                    "seconds": args.env_seconds})  # fmt: skip
        got: Any = bench_impala.reference(one, act=False)  # (steps/s, CPU us per step)
        rate = float(got[0] if isinstance(got, tuple) else got)
        loops["harness (ALE/Pong-v5, DeepMind preprocessing)"] = rate * FRAME_SKIP
        for kind in envs:
            try:
                loops[f"SF {kind} (PongNoFrameskip-v4)"] = sf_env_loop(args, kind)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # harness's rows still come
                print(f"bench_sf: {exc}", file=sys.stderr)
                loops[f"SF {kind} (PongNoFrameskip-v4), failed"] = math.nan
    combos = [(e, q) for e in envs for q in presets]
    sf_first = {c: run_sf(args, *c, f"{c[0]} env, {c[1]} preset") for c in combos}
    ia = impala_args(args)
    harness: dict[str, tuple[float, Any]] = {}
    for mode in [m for m in args.inference.split(",") if m]:
        delivered, probe = bench_impala.farm(ia, mode)
        harness[mode] = (delivered * FRAME_SKIP, probe)
    sf_after = (
        {c: run_sf(args, *c, f"{c[0]} env, {c[1]} preset, after") for c in combos}
        if args.sf_after
        else {}
    )
    load1 = os.getloadavg()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        for res in [*sf_first.values(), *sf_after.values()]:
            (args.keep / f"sf_{res.label.replace(' ', '_').replace(',', '')}.log").write_text(
                "\n".join(res.log)
            )
    _print(args, argv, loops, (sf_first, sf_after), harness, (load0, load1))
    failed = [r for r in [*sf_first.values(), *sf_after.values()] if r.error]
    for res in failed:
        print(f"\nSF run '{res.label}' failed: {res.error}", file=sys.stderr)
    return 1 if failed else 0


Combo = tuple[str, str]
"""(SF env, SF preset)."""


def _print(
    args: argparse.Namespace,
    argv: list[str] | None,
    loops: dict[str, float],
    sf: tuple[dict[Combo, SFResult], dict[Combo, SFResult]],
    harness: dict[str, tuple[float, Any]],
    loads: tuple[tuple[float, ...], tuple[float, ...]],
) -> None:
    import platform

    from benchlib import cpus_and_model

    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(
        f"bench_sf {stamp}: {cpus_and_model()}, Python {platform.python_version()}; load "
        f"average {loads[0][0]:.1f} at start, {loads[1][0]:.1f} at end"
    )
    shown = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: .venv/bin/python tools/bench_sf.py {shown}")
    if loops:
        print(
            f"\nplain env loops (one process, {args.envs_per_worker} envs, random actions, "
            f"{args.env_seconds:g} s each):\n"
        )
        print("| env | frames/s |\n|---|---:|")
        for name, rate in loops.items():
            print(f"| {name} | {fmt(rate)} |")
    print(
        f"\ntraining frames/s, {args.workers} workers/actors x {args.envs_per_worker} envs, "
        f"window {args.seconds:g} s after {args.warmup:g} s (SF device {args.sf_device}):\n"
    )
    heads = " | ".join(f"harness {m} | harness {m} / SF" for m in harness)
    print(f"| SF env | SF preset | SF APPO (before, after) | {heads} |")
    print("|---|---|---:|" + "---:|---:|" * len(harness))
    first, after = sf
    for combo, one in first.items():
        runs = [r for r in (one, after.get(combo)) if r is not None]
        rates = [r.train_fps for r in runs if not r.error]
        sf_rate = sum(rates) / len(rates) if rates else math.nan
        cells = []
        for rate, _ in harness.values():
            cells += [fmt(rate), "n/a" if math.isnan(sf_rate) else f"**{rate / sf_rate:.2f}x**"]
        runs_shown = ", ".join(fmt(r.train_fps) for r in runs)
        print(f"| {combo[0]} | {combo[1]} | {fmt(sf_rate)} ({runs_shown}) | {' | '.join(cells)} |")
    print()
    for mode, (_, probe) in harness.items():
        print(f"harness {mode}: {probe.updates} updates in the window; metrics: {probe.last}")
    for res in [*first.values(), *after.values()]:
        if not res.error:
            print(f"SF {res.label}: window {res.window_s:.1f} s; last report: {res.last_report}")
    print(
        "\nWhat differs: SF's V-trace path (--with_vtrace True) fails on 2.1.1, so SF runs its "
        "PPO-clip APPO and harness V-trace IMPALA; SF's env is PongNoFrameskip-v4 (no sticky "
        "actions), harness's ALE/Pong-v5 with sticky actions 0.25 (the same emulator work); "
        "SF drops samples older than its max_policy_lag (1000 versions) where harness's "
        f"actors wait at {args.lag}."
    )


if __name__ == "__main__":
    sys.exit(main())
