"""Errors a user can hit. Each message names the thing (file, key, plugin) and says what to do.

The CLI turns every :class:`HarnessError` into a one-paragraph message and exit code 2; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable


class HarnessError(Exception):
    """Base class for errors caused by input (config, plugins, paths), not by bugs."""


class ConfigError(HarnessError):
    """A config file or override is wrong: unknown key, wrong type, malformed file."""


class PluginError(HarnessError):
    """A plugin is missing, duplicated or broken."""


class CheckpointError(HarnessError):
    """A checkpoint is missing, corrupt or belongs to another algorithm/backend."""


class DivergedError(HarnessError):
    """Training produced a non-finite loss or non-finite weights."""


class IncompatibleError(HarnessError):
    """Components that cannot work together, e.g. DQN on a continuous action space."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ' Did you mean 'x'?' for the closest choices (spelled alike, or abbreviated by
    their words' initials: ``lr`` for ``learning_rate``), or a list of the choices."""
    options = sorted(set(choices))
    abbreviated = [c for c in options if len(name) >= 2 and _initials(c) == name.lower()]
    spelled = difflib.get_close_matches(name, options, n=3, cutoff=0.5)
    close = (abbreviated + [c for c in spelled if c not in abbreviated])[:3]
    if close:
        return " Did you mean " + " or ".join(repr(c) for c in close) + "?"
    if not options:
        return ""
    shown = ", ".join(options[:12]) + (", ..." if len(options) > 12 else "")
    return f" Known: {shown}."


def _initials(choice: str) -> str:
    """First letters of the words of ``choice`` (split at ``_``, ``-``, ``.`` and ``/``)."""
    return "".join(word[0] for word in re.split(r"[_\-./]+", choice.lower()) if word)
