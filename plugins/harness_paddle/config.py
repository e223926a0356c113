"""The [backend] options of the ``paddle`` backend: a module of their own, so that the plugin
(which registers them) and the backend (which reads them) both import it and not each other."""

from __future__ import annotations

from dataclasses import dataclass

from harness.backend_common import AMP_MODES, BackendOptions

__all__ = ["AMP_MODES", "PaddleConfig"]


@dataclass
class PaddleConfig(BackendOptions):
    """Options of the paddle backend ([backend] section). The same keys as the torch backend's
    (:class:`BackendOptions`: threads, processes_per_host, the amp check), so a pack's
    [backend] section works with either; the fields below say them in paddle's terms."""

    device: str = "auto"
    """'auto' (a GPU when this paddle build has CUDA and sees one, else CPU), 'cpu', 'gpu',
    'gpu:N'; 'cuda' and 'cuda:N' are accepted as the same."""
    deterministic: bool = False
    """Ask paddle for deterministic kernels (FLAGS_cudnn_deterministic; slower on GPU)."""
    amp: str = "off"
    """Mixed precision for the learner on a GPU: 'off', 'bf16' (auto_cast O1, no loss
    scaling) or 'fp16' (auto_cast O1 with dynamic loss scaling). Weights and optimiser state
    stay float32; a CPU run ignores it (with a warning)."""
    pin_memory: bool = True
    """GPU only: copy big host batches (>= 256 KiB) through pinned host memory."""
