"""Registers every pack directory beside this file."""

from __future__ import annotations

from pathlib import Path

from harness import hookimpl
from harness.config import PACK_FILE_NAMES
from harness.registry import CommandSpec, CompetitionSpec
from harness_competitions import baselines

HERE = Path(__file__).resolve().parent


@hookimpl
def harness_register_competitions() -> list[CompetitionSpec]:
    packs = []
    for directory in sorted(p for p in HERE.iterdir() if p.is_dir()):
        for name in PACK_FILE_NAMES:
            if (directory / name).is_file():
                packs.append(CompetitionSpec(directory.name, directory / name))
                break
    return packs


@hookimpl
def harness_register_commands() -> list[CommandSpec]:
    return [
        CommandSpec(
            "baselines",
            add_arguments=baselines.add_arguments,
            run=baselines.run,
            help="reproduce the reference results in baselines/",
            description=baselines.DESCRIPTION,
        )
    ]
