"""Old import paths of names that moved when the runtime was split by job: they keep working
for one release, each access warning with the new import (a module's ``__getattr__``)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def old_paths(module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module`` whose names ``moved`` maps to the module that
    holds them now: the name from there, with a DeprecationWarning naming that import."""

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is deprecated: import {name} from {moved[name]}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(moved[name]), name)

    return __getattr__
