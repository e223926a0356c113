"""No bad input edits or loses a run, through the real CLI (issue 48, items 5-8):

* a resume reads and checks its checkpoint before it writes: a damaged one exits 2 with the
  run directory's bytes (config.toml, run.json, the checkpoints) as they were;
* a run directory is locked while a process writes into it: a second ``run --resume`` and an
  ``eval`` exit 2 naming the live run's pid, and a killed holder blocks nothing;
* the disk: ``--out`` must be a writable directory with room for a checkpoint, and a disk that
  fills during a run ends it with exit 2 naming the path and the space needed, the last good
  checkpoint and ``latest`` kept and the summary written;
* a damaged checkpoint in ``eval`` / ``export`` and a read-only ``--out`` of ``report`` /
  ``export`` are one paragraph each.

Full disks and read-only directories are real: a small tmpfs, mounted in a private user and
mount namespace (``unshare -rm``) that the test's shell script runs in (root's permissions
would ignore a ``chmod``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.api import EnvInfo, SpaceInfo
from harness.config import check_learning_rate, is_learning_rate, layer, resolve
from harness.errors import ConfigError
from harness.plugins import collect_registry, make_plugin_manager
from harness.runtime.build import check_replay_memory, replay_row_bytes

PACK = Path(__file__).resolve().parents[2] / "competitions" / "cartpole"
FAST = ["--set", "run.eval_episodes=2", "--set", "run.trackers=[]", "--no-progress"]


def harness(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, one paragraph naming ``needles``, no traceback; returns the paragraph."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("harness: error:")]
    assert len(error) == 1, proc.stderr
    for needle in needles:
        assert needle in error[0], error[0]
    return error[0]


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run directory and its bytes (the lock file aside: taking the lock
    writes the taker's pid into it)."""
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short finished CartPole run; tests work on copies of it."""
    out = tmp_path_factory.mktemp("finished")
    csv = ["--set", 'run.trackers=["csv"]']  # (a metrics.csv for harness report)
    proc = harness("run", str(PACK), "--steps", "1024", "--out", str(out), *FAST, *csv)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = out.iterdir()
    return run_dir


@pytest.fixture
def run_copy(finished_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / finished_run.name
    shutil.copytree(finished_run, copy)
    return copy


def checkpoint_of(run_dir: Path) -> Path:
    (ckpt,) = (run_dir / "checkpoints").glob("step_*")
    return ckpt


# ------------------------------------------------------------------------------------------
# A resume checks before it writes (item 5)


def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize(
    ("damage", "needles"),
    [
        (lambda c: _truncate(c / "runner.json", 0.5), ["runner.json cannot be read"]),
        (lambda c: (c / "runner.json").write_text('{"step": 5}'), ["no valid 'iteration'"]),
        (lambda c: _truncate(next(c.glob("agent.*")), 0.0), ["is empty"]),
        (lambda c: _truncate(next(c.glob("agent.*")), 0.5), ["agent."]),
        (lambda c: _truncate(c / "meta.json", 0.5), ["unreadable meta.json"]),
    ],
    ids=["runner-truncated", "runner-incomplete", "agent-empty", "agent-truncated", "meta"],
)
def test_a_resume_from_a_damaged_checkpoint_changes_no_byte(
    run_copy: Path, damage: object, needles: list[str]
) -> None:
    ckpt = checkpoint_of(run_copy)
    damage(ckpt)  # type: ignore[operator]
    before = snapshot(run_copy)
    proc = harness("run", "--resume", str(run_copy), "--steps", "2048", *FAST)
    assert_error(proc, str(ckpt), *needles)
    after = snapshot(run_copy)
    assert after["config.toml"] == before["config.toml"]
    assert after["run.json"] == before["run.json"]
    assert after == before


# ------------------------------------------------------------------------------------------
# The run directory lock (item 6)


def _wait_for(predicate: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_a_live_run_locks_its_directory_against_resume_and_eval(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    live = subprocess.Popen(
        [
            *(sys.executable, "-m", "harness.cli", "run", str(PACK), "--steps", "10000000"),
            *("--out", str(out), "--set", "run.checkpoint_every=512"),
            *("--set", "run.eval_every=0", *FAST, "--set", 'run.trackers=["csv"]'),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(lambda: list(out.glob("*/checkpoints/latest")), 120)
        (run_dir,) = out.iterdir()
        assert (run_dir / ".lock").read_text().split()[0] == str(live.pid)
        config = (run_dir / "config.toml").read_bytes()
        run_json = (run_dir / "run.json").read_bytes()
        holder = f"process {live.pid} (harness run"
        resume = harness("run", "--resume", str(run_dir), "--steps", "20000000", *FAST[-1:])
        assert_error(resume, "is in use by", holder, "harness run --resume would write")
        evaluation = harness("eval", str(run_dir), "--episodes", "1")
        assert_error(evaluation, holder, "harness eval")
        assert_error(harness("report", str(run_dir)), holder, "harness report")
        assert not (run_dir / "report.html").exists()
        assert (run_dir / "config.toml").read_bytes() == config
        assert (run_dir / "run.json").read_bytes() == run_json
        assert not (run_dir / "evaluations.jsonl").exists()
    finally:
        live.send_signal(signal.SIGKILL)  # no clean exit: the lock file stays behind
        live.wait(30)
    assert (run_dir / ".lock").read_text().split()[0] == str(live.pid)
    evaluation = harness("eval", str(run_dir), "--episodes", "1")  # a dead holder blocks nothing
    assert evaluation.returncode == 0, evaluation.stderr
    assert (run_dir / "evaluations.jsonl").is_file()


# ------------------------------------------------------------------------------------------
# The disk (item 7): preflight and a disk that fills


@pytest.fixture(scope="module")
def namespaces(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip where no private mount namespace with a tmpfs can be made."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    mount = tmp_path_factory.mktemp("probe")
    probe = in_tmpfs(mount, "1m", "touch " + shlex.quote(str(mount / "x")))
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {probe.stderr.strip()}")


def in_tmpfs(
    mount: Path, size: str, script: str, *, read_only: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run shell ``script`` with a fresh tmpfs of ``size`` on ``mount``, in a user and mount
    namespace of its own (the tmpfs goes away with it). ``$HARNESS`` runs the CLI."""
    options = f"size={size}" + (",ro" if read_only else "")
    harness_cmd = shlex.join([sys.executable, "-m", "harness.cli"])
    body = f"mount -t tmpfs -o {options} tmpfs {shlex.quote(str(mount))} || exit 99\n"
    body += f"HARNESS={shlex.quote(harness_cmd)}\n{script}"
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", body], capture_output=True, text=True, timeout=180
    )


def test_an_out_that_is_a_file_is_refused(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    proc = harness("run", str(PACK), "--steps", "256", "--out", str(afile), *FAST)
    assert_error(proc, f"run.out (--out) {afile} is a file")
    proc = harness("run", str(PACK), "--steps", "256", "--out", str(afile / "sub"), *FAST)
    assert_error(proc, f"{afile / 'sub'} cannot be created", f"{afile} is a file")
    assert afile.read_text() == "x"


@pytest.mark.usefixtures("namespaces")
def test_a_read_only_out_is_refused(tmp_path: Path) -> None:
    mount = tmp_path / "ro"
    mount.mkdir()
    runs = mount / "runs"
    proc = in_tmpfs(mount, "1m", f"$HARNESS run {PACK} --steps 256 --out {runs}", read_only=True)
    assert_error(proc, f"run.out (--out) {runs} is not writable", "Read-only file system")


@pytest.mark.usefixtures("namespaces")
def test_too_little_free_space_for_a_checkpoint_is_refused_before_training(
    tmp_path: Path,
) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    # DQN's replay memory (100k CartPole transitions, ~4.8 MB once full) is in its checkpoint
    script = f"$HARNESS run {PACK} --steps 256 --out {mount / 'runs'} --set run.algo=dqn"
    script += f" {shlex.join(FAST)}; rc=$?; ls -A {mount}; exit $rc"
    proc = in_tmpfs(mount, "2m", script)
    error = assert_error(proc, f"run.out (--out) {mount / 'runs'} has", "free", "needs about")
    assert "MiB" in error
    assert proc.stdout.split() == []  # no run directory, not even run.out


FILL_DISK = '''
"""Fills the file system of run.out after the run's first checkpoint, leaving a few KiB."""
import os

from harness import hookimpl

LEAVE = 12 * 1024
filled = False


@hookimpl
def harness_checkpoint(run, path):
    global filled
    if filled:
        return
    filled = True
    fd = os.open(os.path.join(os.path.dirname(run.run_dir), "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(65536))
    except OSError:
        pass
    os.ftruncate(fd, max(0, os.fstat(fd).st_size - LEAVE))
    os.close(fd)
'''


@pytest.mark.usefixtures("namespaces")
def test_a_disk_that_fills_keeps_the_last_checkpoint_and_ends_with_exit_2(
    tmp_path: Path,
) -> None:
    (tmp_path / "fill_disk.py").write_text(FILL_DISK)
    mount, kept = tmp_path / "disk", tmp_path / "kept"
    mount.mkdir()
    runs = mount / "runs"
    args = ["run", str(PACK), "--steps", "4096", "--out", str(runs), "-p", "fill_disk"]
    args += ["--set", "run.checkpoint_every=1024", "--set", "run.eval_every=0", *FAST]
    script = (
        f"PYTHONPATH={shlex.quote(str(tmp_path))} $HARNESS {shlex.join(args)}; rc=$?\n"
        f"rm -f {runs / 'filler'}; cp -a {runs} {kept}; exit $rc"
    )
    proc = in_tmpfs(mount, "4m", script)
    (run_dir,) = kept.iterdir()
    ckpts = run_dir / "checkpoints"
    error = assert_error(
        proc, "The disk is full", "step 2048", str(runs / run_dir.name / "checkpoints")
    )
    assert "a checkpoint needs about" in error and "--resume" in error
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_0000001024"]
    assert (ckpts / "latest").read_text().strip() == "step_0000001024"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] >= 2048 and summary["checkpoint"].endswith("step_0000001024")
    assert "The disk is full" in summary["error"]
    assert (run_dir / "config.toml").is_file()  # the run is kept: resume it


def test_the_replay_memory_estimate_refuses_what_memory_cannot_hold() -> None:
    """``algo.buffer_size`` against the memory available (a given number here: the CLI case
    in test_cli_bad_input.py uses this machine's)."""
    registry = collect_registry(make_plugin_manager())
    info = EnvInfo(
        "CartPole-v1", SpaceInfo("box", (4,), "float32"), SpaceInfo("discrete", (), "int64", 2), 1
    )
    assert replay_row_bytes(info) == 2 * 16 + 8 + 4 + 4
    config = resolve(
        layer(None, overrides=["run.algo=dqn", "algo.buffer_size=2_000_000"]), registry
    )
    check_replay_memory(config, info, available_mb=100)  # 2M x 48 bytes: 91.6 MiB
    with pytest.raises(ConfigError, match=r"92 MiB .* 90 MiB available.*buffer_size=900000\."):
        check_replay_memory(config, info, available_mb=90)
    images = dataclasses.replace(info, observation=SpaceInfo("box", (4, 84, 84), "uint8"))
    assert replay_row_bytes(images) == 2 * 4 * 84 * 84 + 8 + 4 + 4


# ------------------------------------------------------------------------------------------
# eval / export / report (item 8)


@pytest.mark.parametrize("command", ["eval", "export"])
@pytest.mark.parametrize(
    ("damage", "needles"),
    [
        (lambda c: (c / "meta.json").write_text('{"algo": "pp'), ["unreadable meta.json"]),
        (lambda c: _truncate(next(c.glob("agent.*")), 0.0), ["is empty"]),
    ],
    ids=["meta-garbled", "agent-empty"],
)
def test_a_damaged_checkpoint_is_one_paragraph(
    run_copy: Path, command: str, damage: object, needles: list[str]
) -> None:
    if command == "export" and importlib.util.find_spec("onnx") is None:
        pytest.skip("harness[onnx] is not installed")
    ckpt = checkpoint_of(run_copy)
    damage(ckpt)  # type: ignore[operator]
    before = snapshot(run_copy)
    assert_error(harness(command, str(run_copy)), str(ckpt), *needles)
    assert snapshot(run_copy) == before


@pytest.mark.usefixtures("namespaces")
@pytest.mark.parametrize("command", ["report", "export"])
def test_an_out_in_a_read_only_directory_is_refused(
    finished_run: Path, tmp_path: Path, command: str
) -> None:
    if command == "export" and importlib.util.find_spec("onnx") is None:
        pytest.skip("harness[onnx] is not installed")
    mount = tmp_path / "ro"
    mount.mkdir()
    out = mount / ("page.html" if command == "report" else "policy.onnx")
    script = f"$HARNESS {command} {finished_run} --out {out}"
    proc = in_tmpfs(mount, "1m", script, read_only=True)
    assert_error(proc, f"{mount} is not writable", "Read-only file system")


# ------------------------------------------------------------------------------------------
# Every algorithm's learning rates, one check


def test_every_algorithms_learning_rates_are_checked() -> None:
    """Each learning-rate option of every installed algorithm refuses NaN, inf and < 0 and
    takes 0 (frozen networks); one generic check: no algorithm needs its own. A search bound
    (harness tune) must be > 0."""
    registry = collect_registry(make_plugin_manager())
    checked = []
    for name, spec in registry.algorithms.items():
        if spec.config_cls is None:
            continue
        for field in dataclasses.fields(spec.config_cls):
            if not is_learning_rate(field.name) or field.type not in (float, "float"):
                continue
            for bad in ("nan", "inf", "-1e-3"):
                override = f"algo.{field.name}={bad}"
                raw = layer(None, overrides=[f"run.algo={name}", override])
                with pytest.raises(ConfigError, match=field.name):
                    resolve(raw, registry)
            frozen = layer(None, overrides=[f"run.algo={name}", f"algo.{field.name}=0.0"])
            try:  # 0 passes the generic check (an algorithm may still need > 0: ES)
                resolve(frozen, registry)
            except ConfigError as exc:
                assert "not a usable learning rate" not in str(exc), exc
            checked.append(f"{name}.{field.name}")
    assert {"ppo.learning_rate", "dqn.learning_rate", "maddpg.lr_actor"} <= set(checked)
    assert "pg.vf_learning_rate" in checked
    check_learning_rate("algo.learning_rate", 3e-4)  # (what harness tune checks bounds with)
    with pytest.raises(ConfigError, match="greater than 0"):
        check_learning_rate("algo.learning_rate", 0.0, "tune.space", zero=False)
    with pytest.raises(ConfigError, match=r"tune\.space"):
        check_learning_rate("algo.learning_rate", -math.inf, "tune.space")
