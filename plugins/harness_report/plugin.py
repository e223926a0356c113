"""The report plugin: ``harness report RUN [RUN...]`` (entry point ``report =
harness_report.plugin``).

Only argparse and harness are imported here; the page is rendered by harness_report.report,
imported when the command runs, so ``harness --help`` stays fast.
"""

from __future__ import annotations

import argparse

from harness import hookimpl
from harness.registry import CommandSpec

DESCRIPTION = """\
Write a self-contained HTML page about a run, or comparing several runs: learning curves
(shaped return, evaluation return, the pack's official score where logged, steps/s), the
evaluation table (summary.json and RUN/evaluations.jsonl of `harness eval`), the newest
evaluation's video (`harness eval RUN --video`), the command that reproduces the run, the
resolved config and the plugin versions (docs/report.md).

RUN is a run directory of `harness run` (it holds config.toml and metrics.csv). The page needs
nothing beside it: styles, charts (inline SVG), images and the video (data: URIs) are inside
the file, so it opens offline and can be mailed or attached. A video over --max-embed-mb is
linked by its relative path instead, and the page says so.

Examples:
  harness report runs/CartPole-v1__ppo__1__1700000000          # -> RUN/report.html
  harness report runs/A runs/B runs/C --out compare.html       # one chart per metric, overlaid
  harness report RUN --screenshot report.png                   # needs chromium
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run directories of `harness run`")
    parser.add_argument(
        "--out",
        metavar="FILE",
        help="where to write the page (default: RUN/report.html for one run, ./report.html "
        "for several); its directory must exist",
    )
    parser.add_argument(
        "--screenshot",
        metavar="PNG",
        help="also save a PNG of the page as headless Chromium draws it (offline)",
    )
    parser.add_argument(
        "--max-embed-mb",
        type=float,
        default=50.0,
        metavar="MB",
        help="embed media files up to this size (default 50); larger ones are linked "
        "relative to the page",
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harness_report.report import make_report

    result = make_report(
        [Path(r) for r in args.runs],
        None if args.out is None else Path(args.out),
        shot=None if args.screenshot is None else Path(args.screenshot),
        max_embed_mb=args.max_embed_mb,
    )
    print(result.summary())
    return 0


@hookimpl
def harness_register_commands() -> list[CommandSpec]:
    return [
        CommandSpec(
            "report",
            add_arguments,
            run,
            help="write a self-contained HTML page of a run (or comparing runs)",
            description=DESCRIPTION,
        )
    ]
