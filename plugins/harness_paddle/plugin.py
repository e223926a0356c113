"""Registers the ``paddle`` backend. Importing this module does not import paddle: the backend
is loaded only when a run selects it (``--set backend=paddle`` or ``HARNESS_BACKEND=paddle``),
so `harness plugins` stays fast and works without PaddlePaddle installed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness import hookimpl
from harness.errors import PluginError
from harness.registry import BackendSpec

AMP_MODES = ("off", "bf16", "fp16")
INSTALL_HINT = "pip install 'harness[paddle]'"


@dataclass
class PaddleConfig:
    """Options of the paddle backend ([backend] section). The same keys as the torch backend's,
    so a pack's [backend] section works with either."""

    device: str = "auto"
    """'auto' (a GPU when this paddle build has CUDA and sees one, else CPU), 'cpu', 'gpu',
    'gpu:N'; 'cuda' and 'cuda:N' are accepted as the same."""
    threads: int = 0
    """Intra-op CPU threads; 0 sizes it to this process's CPU share (affinity / processes)."""
    processes_per_host: int = 1
    """How many harness processes share this host's CPUs (sets the automatic thread count)."""
    deterministic: bool = False
    """Ask paddle for deterministic kernels (FLAGS_cudnn_deterministic; slower on GPU)."""
    amp: str = "off"
    """Mixed precision for the learner on a GPU: 'off', 'bf16' (auto_cast O1, no loss
    scaling) or 'fp16' (auto_cast O1 with dynamic loss scaling). Weights and optimiser state
    stay float32; a CPU run ignores it (with a warning)."""
    pin_memory: bool = True
    """GPU only: copy big host batches (>= 256 KiB) through pinned host memory."""

    def __post_init__(self) -> None:
        if self.amp not in AMP_MODES:
            raise ValueError(f"amp = {self.amp!r} is not one of {', '.join(AMP_MODES)}")


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
