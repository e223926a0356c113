"""Registers the ``torch`` backend. Importing this module does not import torch: the backend
is loaded only when a run selects it, so `harness plugins` stays fast and works without torch."""

from __future__ import annotations

from typing import Any

from harness import hookimpl
from harness.errors import PluginError
from harness.registry import BackendSpec
from harness_torch.config import AMP_MODES, TorchConfig

__all__ = ["AMP_MODES", "TorchConfig", "harness_register_backends", "load"]


def load(config: TorchConfig | None = None) -> Any:
    try:
        from harness_torch.backend import TorchBackend
    except ImportError as exc:
        raise PluginError(
            f"The torch backend needs PyTorch, which is not importable ({exc}). Install it with "
            f"`pip install 'harness[torch]'` (CPU-only machines: pip install torch --index-url "
            f"https://download.pytorch.org/whl/cpu)."
        ) from None
    return TorchBackend(config or TorchConfig())


@hookimpl
def harness_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            "torch",
            load=load,
            config_cls=TorchConfig,
            install_hint="pip install 'harness[torch]'",
            description="PyTorch on CPU or CUDA",
            preload=("torch", "harness_torch.backend"),
        )
    ]
