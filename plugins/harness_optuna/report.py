"""Study outputs: ``best.toml`` (a runnable override), the terminal summary and the plots."""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path
from typing import Any

from harness.config import Config, dump_toml

log = logging.getLogger(__name__)

TUNER_RUN_KEYS = ("out", "name", "progress")


def best_overrides(trial_config: dict[str, dict[str, Any]], pack: Config) -> dict[str, Any]:
    """The keys where the best trial's config differs from the pack's own config (the whole
    [algo] section when the trial switched algorithm), without the run-directory keys
    harness tune set for the trial."""
    reference = json.loads(json.dumps(pack.to_dict(), default=str))
    out: dict[str, dict[str, Any]] = {}
    switched = trial_config["run"].get("algo") != reference["run"].get("algo")
    for section, values in trial_config.items():
        ref = reference.get(section, {})
        diff = {
            k: v
            for k, v in values.items()
            if (switched and section == "algo") or ref.get(k) != v
            if not (section == "run" and k in TUNER_RUN_KEYS)
        }
        if diff:
            out[section] = diff
    return out


def write_best(study: Any, pack_file: Path, pack: Config, study_dir: Path) -> Path | None:
    """``best.toml``: ``harness run PACK --config best.toml`` trains the best trial's config.
    None when no trial completed."""
    try:
        best = study.best_trial
    except ValueError:
        return None
    config = best.user_attrs.get("config")
    if config is None:
        log.warning("best trial %d has no stored config; no best.toml", best.number)
        return None
    path = study_dir / "best.toml"
    params = ", ".join(f"{k} = {v!r}" for k, v in best.params.items())
    header = [
        f"# Best trial {best.number} of study {study.study_name!r}: value {best.value!r}",
        f"# params: {params}",
        f"# reproduce: harness run {pack_file} --config {path}",
        "",
    ]
    body = dump_toml(best_overrides(config, pack))
    path.write_text("\n".join(header) + body, encoding="utf-8")
    return path


def summary_table(study: Any, top: int = 10) -> Any:
    """A rich table: counts by state, then the best ``top`` finished trials."""
    from optuna.trial import TrialState
    from rich.table import Table

    trials = study.get_trials(deepcopy=False)
    counts = {s.name: sum(t.state == s for t in trials) for s in TrialState}
    shown = ", ".join(f"{n} {c}" for n, c in counts.items() if c)
    table = Table(title=f"study {study.study_name}: {shown}")
    keys = sorted({k for t in trials for k in t.params})
    for column in ("trial", "state", "value", "steps", "seconds", *keys):
        table.add_column(column, justify="right" if column != "state" else "left")
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    sign = -1.0 if study.direction.name == "MAXIMIZE" else 1.0

    def order(t: Any) -> tuple[int, float]:
        value = t.value if t.value is not None else math.inf * -sign
        return (t.state != TrialState.COMPLETE, sign * value)

    for t in sorted(finished, key=order)[:top]:
        seconds = t.duration.total_seconds() if t.duration else float("nan")
        table.add_row(
            str(t.number),
            t.state.name,
            "-" if t.value is None else f"{t.value:.4g}",
            str(t.last_step) if t.last_step is not None else "-",
            f"{seconds:.1f}",
            *(_fmt(t.params.get(k)) for k in keys),
        )
    return table


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


PLOTS = {
    "optimization_history": "plot_optimization_history",
    "param_importances": "plot_param_importances",
    "parallel_coordinate": "plot_parallel_coordinate",
}


def write_plots(study: Any, study_dir: Path) -> list[Path]:
    """PNG plots through optuna.visualization.matplotlib; HTML too when plotly is installed.
    A plot that cannot be drawn (e.g. importances of fewer than two completed trials) is
    skipped with a warning."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization as vis
    import optuna.visualization.matplotlib as mvis

    written: list[Path] = []
    for name, func in PLOTS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax = getattr(mvis, func)(study)
                fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
                fig.set_size_inches(9, 5.5)
                fig.tight_layout()
                path = study_dir / f"{name}.png"
                fig.savefig(path, dpi=100)
                plt.close(fig)
            written.append(path)
        except Exception as exc:
            log.warning("plot %s skipped: %s", name, exc)
            continue
        if vis.is_available():  # plotly: optional
            try:
                html = study_dir / f"{name}.html"
                getattr(vis, func)(study).write_html(str(html))
                written.append(html)
            except Exception as exc:
                log.warning("plot %s.html skipped: %s", name, exc)
    return written
