"""The [backend] options of the ``torch`` backend: a module of their own, so that the plugin
(which registers them) and the backend (which reads them) both import it and not each other."""

from __future__ import annotations

from dataclasses import dataclass

from harness.backend_common import AMP_MODES, BackendOptions

__all__ = ["AMP_MODES", "TorchConfig"]


@dataclass
class TorchConfig(BackendOptions):
    """Options of the torch backend ([backend] section). The shared keys (threads,
    processes_per_host and the amp check) come from :class:`BackendOptions`; the fields below
    that restate one say it in torch's terms (the docstrings are ``harness run --help``)."""

    device: str = "auto"
    """'auto' (CUDA when present, else CPU), 'cpu', 'cuda' or 'cuda:N'."""
    deterministic: bool = False
    """Use deterministic kernels (slower on CUDA)."""
    amp: str = "off"
    """Mixed precision for the learner on CUDA: 'off', 'bf16' (autocast, no loss scaling) or
    'fp16' (autocast with dynamic loss scaling). Weights and optimiser state stay float32; a
    CPU run ignores it (with a warning)."""
    pin_memory: bool = True
    """CUDA only: copy big host batches (>= 256 KiB) to the GPU through reusable pinned
    buffers, asynchronously, converting dtypes on the GPU (uint8 frames travel as bytes)."""
    flush_denormal: bool = True
    """Treat subnormal floats (|x| < 1.2e-38) as zero on this process's CPU (x86 FTZ/DAZ), as
    TensorFlow does by default. Adam's moment estimates of units whose gradient stays zero
    decay into that range, where x86 arithmetic is many times slower: it cost ~1.4 ms of TD3's
    ~10 ms Pendulum update (docs/benchmarks.md). Numerics change only below 1.2e-38."""
    reuse_freed_memory: bool = True
    """glibc hosts: keep freed host memory mapped for reuse (``mallopt``: allocations below
    32 MiB from the heap, up to 256 MiB of free heap kept) instead of handing it back to the
    kernel. An update frees and re-allocates megabytes of activations and gradients; with
    glibc's defaults each reuse maps fresh pages, a page fault and a zeroing per 4 KiB
    (200-460 per SAC/TD3 Pendulum update, docs/benchmarks.md). Process-wide and sticky once
    set; false leaves the allocator alone. No effect without glibc."""
    int8_acting: bool = False
    """CPU acting copies of CNN trunks (``inference``: farm actors, serial acting, evaluation)
    run in int8 (per-channel weights, activation ranges calibrated on the first batch after
    each refresh): the Nature CNN 3-4x faster per observation on x86, features within ~1% of
    float. The learner trains in float32; IMPALA's V-trace and PPO's ratio correct for the
    difference through the recorded behaviour log-probabilities. MLPs are unaffected."""
