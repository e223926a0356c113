"""The report page of one or several runs, filled into report.html.

Sections: an overview row per run, the config keys that differ between runs, one chart per
metric with every run overlaid (:mod:`harness_report.charts`), then per run its evaluations
(summary.json and evaluations.jsonl), the newest evaluation's video, the command that reproduces
it, the resolved config and the plugin versions.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness import __version__
from harness_report import charts, media
from harness_report.rundata import Evaluation, RunData
from harness_report.template import Html, Template, join, load

MISSING = "—"


def fmt(value: Any) -> str:
    """A table cell: numbers to 2 decimals (or as ints), absent as a dash."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e5 or value.is_integer() else f"{value:.2f}"
    return str(value)


def fmt_time(value: Any) -> str:
    """evaluations.jsonl's ``time`` (an ISO 8601 string in UTC, as `harness eval` writes it,
    or seconds since the epoch) as "2026-01-31 12:00:00 UTC"."""
    when = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        when = dt.datetime.fromtimestamp(value, dt.UTC)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            when = dt.datetime.fromisoformat(value)
    if when is None:
        return fmt(value)
    if when.tzinfo is not None:
        when = when.astimezone(dt.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S") + (" UTC" if when.tzinfo is not None else "")


def display_names(runs: Sequence[RunData]) -> list[str]:
    """Each run's directory name, or the path as given where two runs share a name."""
    names = [r.name for r in runs]
    return [str(r.path) if names.count(r.name) > 1 else r.name for r in runs]


def newest_summary(ev: Evaluation | None) -> str:
    if ev is None:
        return MISSING
    text = f"{fmt(ev.get('mean_return'))} ± {fmt(ev.get('std_return'))}"
    if ev.get("score") is not None:
        text += f", score {fmt(ev.get('score'))}"
    return f"{text} ({fmt(ev.get('episodes'))} episodes, step {fmt(ev.get('step'))})"


def overview_row(t: Template, run: RunData, name: str, anchor: str) -> Html:
    last_step = max((x for pts in run.metrics.values() for x, _ in pts), default=None)
    steps = run.summary.get("steps", last_step)
    return t.block(
        "overview_row",
        anchor=anchor,
        name=name,
        env=fmt(run.run_config("env")),
        algo=fmt(run.run_config("algo")),
        backend=fmt(run.run_config("backend")),
        seed=fmt(run.run_config("seed")),
        steps=fmt(int(steps) if isinstance(steps, float) else steps),
        final_eval=fmt(run.summary.get("final_eval")),
        best_eval=fmt(run.summary.get("best_eval")),
        newest=newest_summary(run.evaluations[-1] if run.evaluations else None),
    )


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_diff(t: Template, runs: Sequence[RunData], names: Sequence[str]) -> Html:
    """The config keys whose values differ between the runs (a missing key counts as a
    difference); empty for one run or identical configs."""
    if len(runs) < 2:
        return Html("")
    flats = [flatten(r.config) for r in runs]
    keys = sorted({k for f in flats for k in f})
    differ = [k for k in keys if len({repr(f.get(k, MISSING)) for f in flats}) > 1]
    if not differ:
        return t.block("note", text="The runs' resolved configs are identical.")
    rows = [
        t.block(
            "tr",
            cells=join(
                [t.block("td", text=k)] + [t.block("td", text=fmt(f.get(k))) for f in flats]
            ),
        )
        for k in differ
    ]
    heads = join(t.block("th", text=n) for n in names)
    return t.block("config_diff", heads=heads, rows=join(rows))


def eval_row(t: Template, ev: Evaluation) -> Html:
    metrics = ev.get("metrics")
    metric_text = (
        ", ".join(f"{k} {fmt(v)}" for k, v in metrics.items())
        if isinstance(metrics, dict) and metrics
        else MISSING
    )
    cells = [
        t.block("td", text=fmt_time(ev.get("time"))),
        t.block("td", text=fmt(ev.get("checkpoint"))),
        t.block("td_num", text=fmt(ev.get("step"))),
        t.block("td", text=fmt(ev.get("protocol"))),
        t.block("td_num", text=fmt(ev.get("episodes"))),
        t.block("td_num", text=fmt(ev.get("seed"))),
        t.block("td_num", text=fmt(ev.get("mean_return"))),
        t.block("td_num", text=fmt(ev.get("std_return"))),
        t.block("td_num", text=fmt(ev.get("score"))),
        t.block("td", text=metric_text),
        t.block("td", text=fmt(ev.get("command"))),
    ]
    return t.block("tr", cells=join(cells))


def evaluations(t: Template, run: RunData) -> Html:
    parts = []
    if "final_eval" in run.summary or "best_eval" in run.summary:
        parts.append(
            t.block(
                "eval_summary",
                final_eval=fmt(run.summary.get("final_eval")),
                best_eval=fmt(run.summary.get("best_eval")),
                steps=fmt(run.summary.get("steps")),
            )
        )
    if run.evaluations:
        rows = join(eval_row(t, ev) for ev in reversed(run.evaluations))  # newest first
        parts.append(t.block("eval_table", rows=rows))
    else:
        parts.append(
            t.block(
                "note",
                text="No evaluations.jsonl yet: `harness eval RUN --video` evaluates the newest "
                "checkpoint, records a video and adds a row here.",
            )
        )
    return join(parts)


def media_section(t: Template, run: RunData, name: str, page: Path, max_bytes: int) -> Html:
    """The newest evaluation that recorded media: its video (GIF as the fallback image) and
    filmstrip; a warning for a listed file that is gone."""
    keys = ("video", "gif", "filmstrip")
    ev = next((e for e in reversed(run.evaluations) if any(e.get(k) for k in keys)), None)
    if ev is None:
        return Html("")
    found: dict[str, media.Media] = {}
    for key in keys:
        path = ev.media(run.path, key)
        if path is None:
            continue
        if not path.is_file():
            run.warnings.append(
                f"evaluations.jsonl line {ev.line} lists {key} {ev.get(key)!r}, which is not "
                f"in {run.path}: rerun `harness eval {run.path} --video` to record it again."
            )
            continue
        found[key] = media.reference(path, page, max_bytes)

    def caption(m: media.Media) -> str:
        if m.embedded:
            return f"{m.path.name}, {media.megabytes(m.size)}, embedded."
        return (
            f"{m.path.name} is {media.megabytes(m.size)}, over the embedding cap of "
            f"{media.megabytes(max_bytes)} (--max-embed-mb): linked as {m.src}, so it plays "
            f"only beside the run directory."
        )

    items = []
    gif = found.pop("gif", None)
    if "video" in found:
        video = found.pop("video")
        fallback = (
            Html("")
            if gif is None
            else t.block("image_hidden", src=gif.src, alt=f"{name}: {gif.path.name}")
        )
        items.append(
            t.block(
                "video",
                run=name,
                src=video.src,
                name=video.path.name,
                fallback=fallback,
                caption=caption(video),
            )
        )
    elif gif is not None:
        found = {"gif": gif, **found}
    for m in found.values():
        items.append(t.block("image", src=m.src, alt=f"{name}: {m.path.name}", cls="still"))
    if not items:
        return Html("")
    what = (
        f"Evaluation of {fmt(ev.get('checkpoint'))} at step {fmt(ev.get('step'))}, "
        f"{fmt_time(ev.get('time'))}: mean return {fmt(ev.get('mean_return'))}"
    )
    return t.block("media", caption=what, items=join(items))


def run_section(
    t: Template, run: RunData, name: str, anchor: str, page: Path, max_bytes: int
) -> Html:
    plugins = run.run_info.get("plugins")
    plugin_rows = [
        t.block(
            "tr",
            cells=join(
                [
                    t.block("td", text=plugin),
                    t.block("td", text=fmt(info.get("distribution"))),
                    t.block("td", text=fmt(info.get("version"))),
                ]
            ),
        )
        for plugin, info in (plugins.items() if isinstance(plugins, dict) else [])
        if isinstance(info, dict)
    ]
    command = run.run_info.get("command")
    original = (
        t.block("original_command", command=command)
        if isinstance(command, str) and command
        else Html("")
    )
    media_html = media_section(t, run, name, page, max_bytes)  # may add warnings: before them
    return t.block(
        "run",
        anchor=anchor,
        name=name,
        run_dir=str(run.path),
        harness_version=fmt(run.run_info.get("harness")),
        warnings=join(t.block("warning", text=w) for w in run.warnings),
        evaluations=evaluations(t, run),
        media=media_html,
        rerun=f"harness run {shlex.quote(str(run.path / 'config.toml'))}",
        original_command=original,
        config=run.config_text,
        plugin_rows=join(plugin_rows),
    )


def render(runs: Sequence[RunData], page: Path, max_embed_bytes: int) -> str:
    """The whole page for ``runs`` (in the order given), to be written to ``page``."""
    t = load()
    names = display_names(runs)
    anchors = [f"run-{i + 1}" for i in range(len(runs))]
    if len(runs) == 1:
        title = f"Run {names[0]}"
        r = runs[0]
        subtitle = f"{fmt(r.run_config('algo'))} on {fmt(r.run_config('env'))} · {r.path}"
    else:
        title = f"Comparing {len(runs)} runs"
        subtitle = ", ".join(names)
    chart_html = charts.charts(t, list(zip(names, (r.metrics for r in runs), strict=True)))
    warnings = []
    if not chart_html:
        wanted = ", ".join(m for m, _ in charts.METRICS)
        warnings.append(
            t.block("warning", text=f"No learning curves: no metrics.csv here has {wanted}.")
        )
    sections = [
        run_section(t, r, n, a, page, max_embed_bytes)
        for r, n, a in zip(runs, names, anchors, strict=True)
    ]
    return t.render(
        version=__version__,
        title=title,
        subtitle=subtitle,
        warnings=join(warnings),
        overview_rows=join(
            overview_row(t, r, n, a) for r, n, a in zip(runs, names, anchors, strict=True)
        ),
        config_diff=config_diff(t, runs, names),
        charts=chart_html,
        runs=join(sections),
        generated=dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
    )
