"""`harness tune`: real Optuna studies (SQLite storage in tmp_path) over competitions/cartpole
with tiny step budgets.

- 6 trials; a deliberately bad trial (learning rate 1e-7, enqueued) is PRUNED by the median
  pruner at its first evaluation; best.toml reproduces the best trial's config.
- `harness tune` killed with SIGKILL mid-trial and run again finishes the study with exactly
  N finished trials; the killed trial is FAIL and the trials finished before are unchanged.
- --jobs 2 runs trials concurrently in two actor processes of the embedded local farm; an
  actor killed mid-trial fails that trial only (tests/distributed/test_cluster.py runs the
  same over a `harness cluster`).
- bad input (unknown key, empty/inverted range, unknown distribution, no [tune], unreachable
  storage) fails before any trial, naming the key or URL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

optuna = pytest.importorskip("optuna")

from optuna.trial import TrialState  # noqa: E402

from harness import cli  # noqa: E402
from harness.config import find_pack_file, layer, resolve  # noqa: E402
from harness.errors import ConfigError, HarnessError  # noqa: E402
from harness.plugins import collect_registry, make_plugin_manager  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACK = find_pack_file(ROOT / "competitions" / "cartpole")
TINY = [
    "run.total_steps=8192",
    "run.eval_every=2048",
    "run.eval_episodes=5",
    "run.checkpoint_every=0",
    "run.trackers=['csv']",
]
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def tune_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "tune.toml"
    path.write_text(body, encoding="utf-8")
    return path


def tune_args(tmp_path: Path, config: Path, *extra: str) -> list[str]:
    args = ["tune", str(PACK), "--config", str(config), "--out", str(tmp_path / "studies")]
    for text in TINY:
        args += ["--set", text]
    return [*args, *extra]


def load(tmp_path: Path, name: str = "cartpole") -> Any:
    url = f"sqlite:///{tmp_path / 'studies' / name / 'study.db'}"
    return optuna.load_study(study_name=name, storage=url)


LR_SPACE = """
[tune.space]
"algo.learning_rate" = { type = "float", low = 1e-7, high = 3e-3, log = true }
"""


def test_six_trials_prune_the_bad_one_and_best_toml_reproduces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HARNESS_WANDB_GROUP", raising=False)  # restored after the test
    config = tune_file(
        tmp_path,
        """
[tune]
trials = 6
pruner = "median"
enqueue = [
  { "algo.learning_rate" = 1e-3 },
  { "algo.learning_rate" = 2e-3 },
  { "algo.learning_rate" = 1e-7 },
]
[tune.pruners.median]
n_startup_trials = 2
n_warmup_steps = 0
"""
        + LR_SPACE,
    )
    assert cli.main(tune_args(tmp_path, config, "--seed", "3")) == 0
    out = capsys.readouterr().out
    assert os.environ["HARNESS_WANDB_GROUP"] == "tune-cartpole"  # W&B groups the trials
    study = load(tmp_path)
    trials = study.get_trials()
    assert sum(t.state in FINISHED for t in trials) == 6 == len(trials)
    bad = trials[2]
    assert bad.params["algo.learning_rate"] == pytest.approx(1e-7)
    assert bad.state == TrialState.PRUNED, f"bad trial not pruned: {bad.intermediate_values}"
    assert bad.last_step == 2048, "the pruned trial should stop at its first evaluation"
    assert trials[0].state == trials[1].state == TrialState.COMPLETE
    assert len(trials[0].intermediate_values) >= 2, "trial.report at every evaluation"
    # outputs: summary, best.toml, plots
    assert "PRUNED" in out and "COMPLETE" in out and "best config" in out
    study_dir = tmp_path / "studies" / "cartpole"
    for name in ("optimization_history", "param_importances", "parallel_coordinate"):
        assert (study_dir / f"{name}.png").stat().st_size > 1000, name
    registry = collect_registry(make_plugin_manager())
    again = resolve(layer(PACK, [study_dir / "best.toml"], [], environ={}), registry).to_dict()
    best = study.best_trial.user_attrs["config"]
    for key in ("out", "name", "progress"):
        best["run"].pop(key)
        again["run"].pop(key)
    assert again == best
    assert again["algo"]["learning_rate"] == study.best_params["algo.learning_rate"]


def _has_study(db: Path) -> bool:
    """Whether ``db`` holds a study yet, read without creating or locking anything."""
    import sqlite3

    if not db.exists():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            return bool(con.execute("SELECT COUNT(*) FROM studies").fetchone()[0])
    except sqlite3.Error:  # tables not made yet
        return False


def _wait_mid_trial(proc: subprocess.Popen[bytes], tmp_path: Path, deadline_s: float) -> int:
    """Poll the storage until one trial finished and another has reported at least once
    (it is mid-training); returns that trial's number."""
    deadline = time.monotonic() + deadline_s
    db = tmp_path / "studies" / "cartpole" / "study.db"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"harness tune ended before it could be killed:\n{err[-2000:]}")
        # only once harness tune has made the study: opening a storage creates its tables,
        # and this poll must not race the run's own creation of them
        trials = load(tmp_path).get_trials() if _has_study(db) else []
        running = [t for t in trials if t.state == TrialState.RUNNING and t.intermediate_values]
        if running and any(t.state in FINISHED for t in trials):
            return int(running[0].number)
        time.sleep(0.2)
    raise AssertionError("no trial was mid-training before the deadline")


def test_killed_study_resumes_without_loss_or_double_counting(tmp_path: Path) -> None:
    config = tune_file(tmp_path, '[tune]\npruner = "none"\n' + LR_SPACE)
    cmd = [sys.executable, "-m", "harness.cli", *tune_args(tmp_path, config, "--trials", "4")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        killed = _wait_mid_trial(proc, tmp_path, deadline_s=120)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    before = {t.number: (t.state, t.value) for t in load(tmp_path).trials if t.state in FINISHED}
    assert load(tmp_path).trials[killed].state == TrialState.RUNNING
    again = subprocess.run(cmd, env=env, capture_output=True, timeout=300, check=False)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    trials = load(tmp_path).trials
    assert trials[killed].state == TrialState.FAIL
    finished = [t for t in trials if t.state in FINISHED]
    assert len(finished) == 4, [(t.number, t.state) for t in trials]
    assert [t.number for t in trials if t.state == TrialState.FAIL] == [killed]
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    for number, (state, value) in before.items():
        assert (trials[number].state, trials[number].value) == (state, value)
    assert len(trials) == 5  # 4 finished + the killed one: nothing ran twice


@pytest.mark.distributed
def test_two_jobs_run_concurrently_on_the_local_farm(
    tmp_path: Path, transport: str = "zmq"
) -> None:
    """On the embedded ZeroMQ farm (tests/distributed/test_ray.py runs it with Ray too)."""
    config = tune_file(tmp_path, '[tune]\npruner = "none"\n' + LR_SPACE)
    args = tune_args(tmp_path, config, "--trials", "3", "--jobs", "2", "--study", "par")
    args += ["--transport", transport]
    assert cli.main(args) == 0
    trials = load(tmp_path, "par").get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    workers = [t.user_attrs["worker"] for t in trials]
    assert os.getpid() not in {w["pid"] for w in workers}, "trials ran in the tune process"
    assert len({w["pid"] for w in workers}) == 2
    a, b = workers[0], workers[1]
    assert a["start"] < b["end"] and b["start"] < a["end"], "the first two trials did not overlap"


def test_a_worker_killed_mid_trial_fails_that_trial_and_the_study_completes(
    tmp_path: Path,
) -> None:
    """kill -9 of a trial's actor: that trial is FAIL, a new actor takes its place and the study
    still ends with the requested number of finished trials (none left RUNNING)."""
    import threading

    import psutil

    config = tune_file(tmp_path, '[tune]\npruner = "none"\n' + LR_SPACE)
    args = tune_args(tmp_path, config, "--trials", "3", "--jobs", "2", "--study", "kill")
    trials_dir = tmp_path / "studies" / "kill" / "trials"
    killed: list[int] = []

    def kill_one_actor_mid_trial() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            if list(trials_dir.glob("trial_*/metrics.csv")):  # a trial is training
                for proc in psutil.Process().children(recursive=True):
                    try:
                        if proc.name().startswith("harness-a"):
                            proc.kill()
                            killed.append(proc.pid)
                            return
                    except psutil.Error:
                        continue
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_actor_mid_trial, daemon=True)
    killer.start()
    assert cli.main(args) == 0
    killer.join(timeout=10)
    assert killed, "no trial actor was found to kill"
    states = [t.state for t in load(tmp_path, "kill").get_trials()]
    assert states.count(TrialState.COMPLETE) == 3, states
    assert states.count(TrialState.FAIL) == 1 and TrialState.RUNNING not in states, states


# ------------------------------------------------------------------------------------------
# Bad input: fails before any trial


def _prepare(tmp_path: Path, body: str, pack: Path = PACK, storage: str | None = None) -> Any:
    from harness_optuna.study import TuneRequest, open_study, prepare

    registry = collect_registry(make_plugin_manager())
    request = TuneRequest(
        pack_file=pack,
        configs=[tune_file(tmp_path, body)],
        out=tmp_path / "studies",
        storage=storage,
    )
    return open_study(prepare(request, registry))


def _space(line: str) -> str:
    return f"[tune.space]\n{line}\n"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            _space('"algo.learning_rat" = { type = "float", low = 1e-4, high = 1e-3 }'),
            ["'algo.learning_rat'", "Did you mean 'algo.learning_rate'"],
        ),
        (
            _space('"algo.learning_rate" = { type = "float", low = 1e-3, high = 1e-4 }'),
            ["'algo.learning_rate'", "inverted range", "low < high"],
        ),
        (
            _space('"algo.n_epochs" = { type = "int", low = 4, high = 4 }'),
            ["'algo.n_epochs'", "empty range"],
        ),
        (
            _space('"algo.learning_rate" = { type = "uniform", low = 1e-4, high = 1e-3 }'),
            ["unknown distribution type 'uniform'", 'type = "float"'],
        ),
        (
            _space('"algo.batch_size" = { type = "categorical", choices = [] }'),
            ["'algo.batch_size'", "non-empty list"],
        ),
        (
            _space('"algo.n_epochs" = { type = "int", low = 1.5, high = 4 }'),
            ["'algo.n_epochs'", "low = 1.5"],
        ),
        (
            _space('"algo.learning_rate" = { type = "float", low = 0.0, high = 1e-3, log = true }'),
            ["log distribution needs low > 0"],
        ),
        ('[tune]\npruner = "medain"\n' + LR_SPACE, ["pruner = 'medain'", "'median'"]),
    ],
)
def test_bad_search_space_fails_before_any_trial(
    tmp_path: Path, body: str, expected: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        _prepare(tmp_path, body)
    for text in expected:
        assert text in str(info.value)
    assert not (tmp_path / "studies").exists(), "a study was created before validation"


def test_missing_tune_section_names_the_pack(tmp_path: Path) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text('[run]\nalgo = "ppo"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"has no \[tune\] section"):
        _prepare(tmp_path, "", pack=pack)


@pytest.mark.parametrize(
    "url", ["postgresql://nobody@127.0.0.1:1/nodb", "sqlite:////nonexistent-dir/sub/study.db"]
)
def test_unreachable_storage_fails_fast_naming_the_url(tmp_path: Path, url: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(HarnessError) as info:
        _prepare(tmp_path, LR_SPACE, storage=url)
    assert url in str(info.value)
    assert time.monotonic() - t0 < 15


def test_cli_reports_bad_input_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tune_file(
        tmp_path, _space('"algo.gae_lamda" = { type = "float", low = 0.8, high = 1 }')
    )
    assert cli.main(tune_args(tmp_path, config)) == 2
    err = capsys.readouterr().err
    assert "'algo.gae_lamda'" in err and "Did you mean 'algo.gae_lambda'" in err


def test_tune_section_is_kept_raw_and_out_of_training(tmp_path: Path) -> None:
    registry = collect_registry(make_plugin_manager())
    config = resolve(layer(PACK, [], [], environ={}), registry)
    assert config.tune["space"]["algo.learning_rate"]["log"] is True
    assert "tune" not in config.to_dict()
    bad = tmp_path / "bad.toml"
    bad.write_text("[tunes]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"Did you mean 'tune'.*Sections are: .*tune"):
        layer(bad, [], [], environ={})


@pytest.mark.parametrize("pruner", ["halving", "hyperband"])
def test_journal_storage_and_the_other_pruners(tmp_path: Path, pruner: str) -> None:
    """A plain path as --storage is an Optuna journal file; halving and hyperband pruners run
    a study to its trial count through it."""
    config = tune_file(tmp_path, "[tune]\ntrials = 3\n" + LR_SPACE)
    journal = tmp_path / "journal.log"
    args = tune_args(tmp_path, config, "--storage", str(journal), "--pruner", pruner, "--seed", "1")
    assert cli.main(args) == 0
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    study = optuna.load_study(
        study_name="cartpole", storage=JournalStorage(JournalFileBackend(str(journal)))
    )
    assert sum(t.state in FINISHED for t in study.get_trials()) == 3
    assert journal.stat().st_size > 0
    assert not (tmp_path / "studies" / "cartpole" / "study.db").exists()  # no SQLite made


def _open_storage_in_a_process(url: str) -> str:
    from harness_optuna.storage import open_storage

    try:
        open_storage(url)
    except HarnessError as exc:
        return str(exc)
    return "ok"


def test_processes_opening_one_new_storage_at_once_all_succeed(tmp_path: Path) -> None:
    """Two processes creating the same fresh SQLite study database race on its CREATE TABLEs
    (11 failures in 20 tries before open_storage tried again); every one must open it."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(3) as pool:
        for k in range(8):
            url = f"sqlite:///{tmp_path / f'race-{k}.db'}"
            results = pool.map(_open_storage_in_a_process, [url] * 3)
            assert results == ["ok"] * 3, results
