"""Registers the ``paddle`` backend. Importing this module does not import paddle: the backend
is loaded only when a run selects it (``--set backend=paddle`` or ``HARNESS_BACKEND=paddle``),
so `harness plugins` stays fast and works without PaddlePaddle installed."""

from __future__ import annotations

from typing import Any

from harness import hookimpl
from harness.errors import PluginError
from harness.registry import BackendSpec
from harness_paddle.config import AMP_MODES, PaddleConfig

__all__ = ["AMP_MODES", "PaddleConfig", "harness_register_backends", "load"]

INSTALL_HINT = "pip install 'harness[paddle]'"


def load(config: PaddleConfig | None = None) -> Any:
    try:
        from harness_paddle.backend import PaddleBackend
    except ImportError as exc:
        raise PluginError(
            f"The paddle backend needs PaddlePaddle, which is not importable ({exc}). Install it "
            f"with `{INSTALL_HINT}` (or 'harness[paddle-gpu]' for the CUDA build)."
        ) from None
    return PaddleBackend(config or PaddleConfig())


@hookimpl
def harness_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            "paddle",
            load=load,
            config_cls=PaddleConfig,
            install_hint=INSTALL_HINT,
            description="PaddlePaddle on CPU or CUDA",
            preload=("paddle", "harness_paddle.backend"),
        )
    ]
