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


class MissingExtraError(PluginError):
    """An optional dependency is not installed; the message names the extra that brings it."""

    def __init__(self, extra: str, module: str, needed_for: str = "") -> None:
        self.extra, self.module = extra, module
        what = f" {needed_for}" if needed_for else " this command"
        super().__init__(
            f"The Python package {module!r} is not installed, and{what} needs it. Install the "
            f"{extra!r} extra: pip install 'harness[{extra}]'."
        )


EXTRAS: dict[str, str] = {
    # top-level module -> the setup.cfg extra that installs it
    "torch": "torch",
    "paddle": "paddle",
    "zmq": "zmq",
    "msgpack": "zmq",
    "cloudpickle": "zmq",
    "psutil": "zmq",
    "ray": "ray",
    "opensim": "osim",
    "osim": "osim",
    "scipy": "osim",
    "wandb": "wandb",
    "tensorboard": "tensorboard",
    "optuna": "tune",
    "minari": "offline",
    "h5py": "offline",
    "pettingzoo": "multiagent",
    "mpe2": "multiagent",
    "popgym": "popgym",
    "ale_py": "atari",
    "mujoco": "mujoco",
    "myosuite": "myo",
    "onnx": "onnx",
    "onnxruntime": "onnx",
    "imageio": "video",
    "imageio_ffmpeg": "video",
    "PIL": "video",
    "pygame": "video",
    "envpool": "envpool",
    "pynvml": "gpu-monitor",
}
"""Which extra installs a module; keep in step with setup.cfg's ``[options.extras_require]``
(tests/integration/test_refused_starts.py checks every extra named here exists there)."""


def missing_extra(exc: BaseException, needed_for: str = "") -> MissingExtraError | None:
    """The :class:`MissingExtraError` for an import error of a module an extra installs, else
    None (an unknown missing module is a bug or a broken install, and keeps its traceback)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    extra = EXTRAS.get(top)
    return None if extra is None else MissingExtraError(extra, top, needed_for)


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
