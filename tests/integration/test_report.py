"""``harness report``: the page of a real CartPole run, read back from a real headless Chromium
with the network refused (it loads, its video plays, its charts hold each run's series, a
screenshot is saved), the comparison page of two runs, and bad input (exit 2, no page).

The run's evaluations are made by ``harness eval`` (one with ``--video``: MP4, GIF, filmstrip)
beside a hand-written older line whose command holds markup the page must escape.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from browser import check_screenshot, chromium_binary, open_page

REPO = Path(__file__).resolve().parents[2]
HARNESS = str(Path(sys.executable).with_name("harness"))
MARKUP = '<img src="x" id="injected">'  # text that would be an element if the page did not escape


def harness(
    *args: str, cwd: Path | None = None, **environ: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **environ}
    return subprocess.run(
        [HARNESS, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def train(out: Path, *extra: str) -> Path:
    """A 5,000-step CartPole PPO run (about 1 s of training); its run directory."""
    r = harness(
        "run",
        "competitions/cartpole",
        "--steps",
        "5000",
        "--out",
        str(out),
        "--no-progress",
        *extra,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir,) = [p for p in out.iterdir() if (p / "config.toml").is_file()]
    return run_dir


def evaluate(run_dir: Path) -> None:
    """Three evaluations in evaluations.jsonl: a hand-written oldest one whose command holds
    markup, then `harness eval` without and with --video (MP4, GIF, filmstrip)."""
    old = {
        "time": "2026-01-01T00:00:00Z",
        "checkpoint": "checkpoints/step_0000002048",
        "step": 2048,
        "env": "CartPole-v1",
        "algo": "ppo",
        "protocol": None,
        "episodes": 3,
        "seed": 7,
        "mean_return": 20.5,
        "std_return": 1.5,
        "returns": [19, 20, 22.5],
        "lengths": [19, 20, 22],
        "metrics": {"x_velocity": 1.25},
        "score": 0.75,
        "video": None,
        "gif": None,
        "filmstrip": None,
        "command": f"harness eval {MARKUP}",
    }
    (run_dir / "evaluations.jsonl").write_text(json.dumps(old) + "\n", encoding="utf-8")
    for extra in ((), ("--video",)):
        r = harness("eval", str(run_dir), "--episodes", "1", *extra)
        assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Path]]:
    """Two real runs (seeds 1 and 2); the first has evaluations and a video."""
    base = tmp_path_factory.mktemp("report-runs")
    first = train(base / "a")
    second = train(base / "b", "--set", "run.seed=2")
    evaluate(first)
    yield [first, second]


class Dom(HTMLParser):
    """Elements (tag, attributes) and the text under each id'd / classed element we ask for."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.texts: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.texts.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        attrs = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [
            a for t, a in self.elements if t == tag and all(a.get(k) == v for k, v in attrs.items())
        ]

    @property
    def text(self) -> str:
        return "".join(self.texts)


def resource_urls(page: str) -> list[str]:
    """Every URL the page would load: src/href/poster attributes and CSS url(...)."""
    dom = Dom(page)
    urls = [a[k] for _, a in dom.elements for k in ("src", "href", "poster", "data") if k in a]
    return urls + [u for u in page.split("url(")[1:]]


def test_run_json_records_the_command(runs: list[Path]) -> None:
    info = json.loads((runs[1] / "run.json").read_text())
    assert info["command"].startswith("harness run competitions/cartpole --steps 5000 --out ")
    assert info["command"].endswith("--no-progress --set run.seed=2")


def test_page_loads_offline_plays_its_video_and_draws_the_charts(
    runs: list[Path], tmp_path: Path
) -> None:
    binary = chromium_binary()
    run_dir = runs[0]
    shot = tmp_path / "report.png"
    r = harness("report", str(run_dir), "--screenshot", str(shot))
    assert r.returncode == 0, r.stderr[-3000:]
    page_file = run_dir / "report.html"
    page = page_file.read_text(encoding="utf-8")
    # self-contained: nothing outside the file (the charts are inline SVG without xmlns)
    assert "http://" not in page and "https://" not in page
    assert all(u.startswith(("data:", "#")) for u in resource_urls(page)), resource_urls(page)
    assert MARKUP not in page  # escaped

    dom = Dom(open_page(binary, tmp_path, page_file.as_uri(), "--dump-dom").stdout)
    (video,) = dom.find("video", data_run=run_dir.name)
    assert video["src"].startswith("data:video/mp4;base64,")
    assert video.get("data-state") == "playing", video.get("data-state")
    (gif,) = dom.find("img", **{"class": "fallback"})  # shown only if the video fails
    assert gif["src"].startswith("data:image/gif;base64,") and "hidden" in gif
    (strip,) = dom.find("img", **{"class": "still"})
    assert strip["src"].startswith("data:image/png;base64,")
    assert dom.find("img", id="injected") == []
    for metric in ("charts/episodic_return", "eval/mean_return", "perf/SPS"):
        assert dom.find("figure", data_metric=metric), metric
    series = dom.find("g", data_run=run_dir.name)
    assert len(series) == 3 and all(int(s["data-points"]) >= 1 for s in series), series
    assert len(dom.find("polyline", **{"class": "series"})) == 3
    rows = dom.text
    assert len(dom.find("table", **{"class": "evaluations"})) == 1
    assert rows.count("checkpoints/step_0000005120") >= 2 and "step_0000002048" in rows
    assert "x_velocity 1.25" in rows
    assert f"harness eval {run_dir} --episodes 1 --video" in rows  # each evaluation's command
    assert f"harness run {run_dir}/config.toml" in rows
    assert "harness run competitions/cartpole --steps 5000" in rows  # run.json's command
    assert 'env = "CartPole-v1"' in rows  # the resolved config
    cells = [t.strip() for t in dom.texts if t.strip()]
    plugins = json.loads((run_dir / "run.json").read_text())["plugins"]
    assert "report" in plugins
    for name, info in plugins.items():  # the plugin versions table, a row per plugin
        row = [name, info["distribution"], info["version"]]
        assert any(cells[i : i + 3] == row for i in range(len(cells))), row

    check_screenshot(shot)
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.std() > 10, "the screenshot is one colour"


def test_a_video_over_the_cap_is_linked_and_still_plays(runs: list[Path], tmp_path: Path) -> None:
    binary = chromium_binary()
    out = runs[0] / "linked.html"
    r = harness("report", str(runs[0]), "--out", str(out), "--max-embed-mb", "0")
    assert r.returncode == 0, r.stderr[-3000:]
    dom = Dom(out.read_text(encoding="utf-8"))
    (video,) = dom.find("video")
    assert video["src"] == "videos/step_0000005120.mp4"
    assert "over the embedding cap" in dom.text
    dom = Dom(open_page(binary, tmp_path, out.as_uri(), "--dump-dom").stdout)
    assert dom.find("video")[0].get("data-state") == "playing"


def test_comparison_page_overlays_the_runs(runs: list[Path], tmp_path: Path) -> None:
    r = harness("report", *map(str, runs), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    dom = Dom((tmp_path / "report.html").read_text(encoding="utf-8"))  # default: ./report.html
    names = [p.name for p in runs]
    for metric in ("charts/episodic_return", "perf/SPS"):
        assert dom.find("figure", data_metric=metric)
    for name in names:
        assert len(dom.find("g", data_run=name)) >= 2  # on the training charts at least
        assert dom.find("section", data_run=name)
    assert len(dom.find("video")) == 1  # only the first run has a video
    diff = dom.text.split("Config differences", 1)[1].split("Learning curves", 1)[0]
    assert "run.seed" in diff and "run.total_steps" not in diff


def test_template_rejects_unfilled_and_raw_text_slots() -> None:
    from harness_report.template import Html, Template

    t = Template("<p>{{a}}</p>{{{b}}}<!--block:x-->\n<i>{{c}}</i>\n<!--endblock-->")
    assert t.render(a="<b>", b=t.block("x", c="&")) == "<p>&lt;b&gt;</p><i>&amp;</i>"
    with pytest.raises(KeyError, match="'b'"):
        t.render(a="1")
    with pytest.raises(TypeError):
        t.render(a="1", b="<b>raw text</b>")  # text cannot reach a markup slot
    with pytest.raises(KeyError, match="without a slot"):
        t.render(a="1", b=Html(""), typo="2")


def _bad_metrics(run: Path) -> None:
    (run / "metrics.csv").write_text("step,charts/episodic_return\n2048,12.5\nabc,13\n")


def _no_step(run: Path) -> None:
    (run / "metrics.csv").write_text("charts/episodic_return\n12.5\n")


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("missing", "is not a directory"),
        ("empty_dir", "is not a run directory: it has no config.toml and no metrics.csv"),
        ("bad_number", "line 3: not a number"),
        ("no_step", "no 'step' column"),
        ("out_dir_missing", "does not exist"),
        ("no_chromium", "HARNESS_CHROMIUM=/nonexistent/chromium is not an executable"),
    ],
)
def test_bad_input_exits_2_with_one_paragraph_and_no_page(
    runs: list[Path], tmp_path: Path, case: str, needle: str
) -> None:
    import shutil

    run = tmp_path / "run"
    out = tmp_path / "page.html"
    if case == "empty_dir":
        run.mkdir()
    elif case in ("bad_number", "no_step"):
        shutil.copytree(runs[1], run)
        (_bad_metrics if case == "bad_number" else _no_step)(run)
    elif case == "out_dir_missing":
        run = runs[1]
        out = tmp_path / "nowhere" / "page.html"
    flags, environ = [], {}
    if case == "no_chromium":
        run = runs[1]
        flags, environ = (
            ["--screenshot", str(tmp_path / "shot.png")],
            {"HARNESS_CHROMIUM": "/nonexistent/chromium"},
        )
    r = harness("report", str(run), "--out", str(out), *flags, **environ)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip().count("\n\n") == 0  # one paragraph
    assert needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()
    assert not any(p.name.startswith(".page.html") for p in tmp_path.iterdir())


def test_run_json_command_survives_a_resume(tmp_path: Path) -> None:
    from harness.runtime.build import command_record, launch_command

    assert launch_command(["/venv/bin/harness", "run", "a b", "--set", "run.seed=2"]) == (
        "harness run 'a b' --set run.seed=2"
    )
    assert launch_command(["/src/harness/__main__.py", "eval", "R"]) == "harness eval R"
    assert launch_command(["pytest", "-k", "x"]) == "pytest -k x"
    assert command_record(None)["command"] == launch_command()
    (tmp_path / "run.json").write_text(json.dumps({"command": "harness run pack --steps 9"}))
    assert command_record(tmp_path) == {
        "command": "harness run pack --steps 9",
        "resumed_with": launch_command(),
    }
    (tmp_path / "run.json").write_text("[1, 2]")  # not an object: this command stands
    assert command_record(tmp_path) == {"command": launch_command()}
