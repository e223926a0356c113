"""What ``harness report`` reads from a run directory, checked before anything is written.

A run directory of ``harness run`` holds config.toml (the resolved config, a runnable pack),
metrics.csv (one row per log step), run.json (config, harness and plugin versions, the launch
command), summary.json (final/best evaluation) and, once ``harness eval`` has run,
evaluations.jsonl (one JSON object per evaluation; media paths relative to the run). Only the
first two are required: the others are shown when present, and a page notes what is missing.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import ConfigError

log = logging.getLogger(__name__)

REQUIRED = ("config.toml", "metrics.csv")


@dataclass
class Evaluation:
    """One line of evaluations.jsonl (keys as ``harness eval`` writes them; absent ones None)."""

    data: dict[str, Any]
    line: int

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def media(self, run_dir: Path, key: str) -> Path | None:
        """The file under ``key`` ("video", "gif", "filmstrip"), relative to the run, if any."""
        value = self.data.get(key)
        return run_dir / str(value) if value else None


@dataclass
class RunData:
    """A run directory's contents, as the page needs them."""

    path: Path  # as the user gave it (shown in commands)
    name: str
    config_text: str
    config: dict[str, Any]  # config.toml parsed
    metrics: dict[str, list[tuple[float, float]]]  # column -> finite (step, value) points
    run_info: dict[str, Any]
    summary: dict[str, Any]
    evaluations: list[Evaluation]
    warnings: list[str] = field(default_factory=list)

    def run_config(self, key: str) -> Any:
        """``[run] key`` of the resolved config, or None."""
        section = self.config.get("run")
        return section.get(key) if isinstance(section, dict) else None


def load_run(path: Path) -> RunData:
    """Read and check the run directory ``path``: a :class:`ConfigError` naming the file and
    the fix for anything the page cannot be made without."""
    if not path.is_dir():
        raise ConfigError(
            f"{path} is not a directory. Give `harness report` run directories of `harness run` "
            f"(RUN = the directory holding config.toml and metrics.csv, e.g. runs/NAME)."
        )
    missing = [name for name in REQUIRED if not (path / name).is_file()]
    if missing:
        inside = sorted(str(p.parent) for p in path.glob("*/metrics.csv"))
        hint = (
            f" It holds runs: {', '.join(inside[:3])}{', ...' if len(inside) > 3 else ''}."
            if inside
            else ""
        )
        raise ConfigError(
            f"{path} is not a run directory: it has no {' and no '.join(missing)}.{hint} Give "
            f"`harness report` the directory `harness run` made (it prints it when it ends; "
            f"under run.out, default runs/), which holds config.toml and metrics.csv."
        )
    warnings: list[str] = []
    config_text = _read_text(path / "config.toml")
    try:
        config = tomllib.loads(config_text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"{path / 'config.toml'} is not valid TOML ({exc}). `harness run` writes it as the "
            f"run's resolved config; restore it from run.json's \"config\" or rerun."
        ) from exc
    return RunData(
        path=path,
        name=path.resolve().name,
        config_text=config_text,
        config=config,
        metrics=read_metrics(path / "metrics.csv"),
        run_info=_read_json(path / "run.json", warnings),
        summary=_read_json(path / "summary.json", warnings),
        evaluations=read_evaluations(path / "evaluations.jsonl", warnings),
        warnings=warnings,
    )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"Cannot read {path}: {exc}. Check its permissions.") from exc


def read_metrics(path: Path) -> dict[str, list[tuple[float, float]]]:
    """metrics.csv as finite (step, value) points per column; empty cells (a metric not logged
    at that step, e.g. eval/* between evaluations) and non-finite values are left out."""
    fix = "It is written by `harness run` (the csv tracker); rerun or restore the file."
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"Cannot read {path}: {exc}. {fix}") from exc
    if not header or "step" not in header:
        raise ConfigError(f"{path} has no 'step' column in its header line. {fix}")
    step_col = header.index("step")
    columns: dict[str, list[tuple[float, float]]] = {n: [] for n in header if n != "step"}
    for lineno, row in enumerate(rows, start=2):
        if not row:
            continue
        if len(row) > len(header):
            raise ConfigError(
                f"{path}, line {lineno}: {len(row)} cells for {len(header)} columns. {fix}"
            )
        try:
            step = float(row[step_col])
            values = [(n, float(c)) for n, c in zip(header, row, strict=False) if c and n != "step"]
        except (ValueError, IndexError) as exc:
            raise ConfigError(f"{path}, line {lineno}: not a number ({exc}). {fix}") from exc
        for name, value in values:
            if math.isfinite(value):
                columns[name].append((step, value))
    return columns


def _read_json(path: Path, warnings: list[str]) -> dict[str, Any]:
    """An optional JSON object file; a missing or broken one is a warning on the page."""
    if not path.exists():
        warnings.append(f"{path.name} is missing: its part of the page is left out.")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        warnings.append(f"{path.name} could not be read ({exc}): its part of the page is left out.")
        return {}
    if not isinstance(data, dict):
        warnings.append(f"{path.name} is not a JSON object: its part of the page is left out.")
        return {}
    return data


def read_evaluations(path: Path, warnings: list[str]) -> list[Evaluation]:
    """evaluations.jsonl, oldest first. A line that is not a JSON object (a write cut short)
    is skipped with a warning that names it, so one bad line does not hide the others."""
    if not path.exists():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        warnings.append(f"{path.name} could not be read ({exc}): no evaluations are shown.")
        return []
    out: list[Evaluation] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            warnings.append(f"{path.name}, line {lineno} is not a JSON object and is left out.")
            continue
        out.append(Evaluation(data, lineno))
    return out
