"""The [backend] options of the ``paddle`` backend: a module of their own, so that the plugin
(which registers them) and the backend (which reads them) both import it and not each other."""

from __future__ import annotations

from dataclasses import dataclass

AMP_MODES = ("off", "bf16", "fp16")


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
