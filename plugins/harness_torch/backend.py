"""The torch implementation of :class:`harness.api.Backend`."""

from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import logging
import math
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from torch import nn

from harness import backend_common, numpy_nets, sequences
from harness.cpus import cpu_share
from harness.errors import ConfigError
from harness_torch import int8
from harness_torch.config import TorchConfig
from harness_torch.int8 import Int8CNN
from harness_torch.recurrent import Recurrent
from harness_torch.state import load_legacy, load_payload, save_payload

log = logging.getLogger(__name__)

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}
# The same activations applied in place, on a hidden layer's fresh output: no new tensor, and
# the pass writes into memory that is still in cache. Autograd allows it: a linear layer keeps
# its input and weights for the backward pass, not its output, and each activation's backward
# reads its own result. (TD3 400x300 Pendulum update 11.4 -> 10.4 ms, docs/benchmarks.md)
_IN_PLACE: dict[type[nn.Module], Callable[[torch.Tensor], torch.Tensor]] = {
    nn.Tanh: torch.tanh_,
    nn.ReLU: torch.relu_,
    nn.ELU: nn.functional.elu_,
}
_DTYPES = {"float32": torch.float32, "int64": torch.int64, "bool": torch.bool, "uint8": torch.uint8}
_LOW_PRECISION = (torch.bfloat16, torch.float16)
PIN_MIN_BYTES = 256 * 1024
"""Host arrays at least this big go to a CUDA device through a pinned staging buffer."""
MAX_STAGING = 32
"""Pinned staging buffers kept (one per array shape and dtype)."""


class _Categorical:
    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = torch.log_softmax(logits, -1)  # one kernel; 11 us vs 42 for x - logsumexp

    def sample(self) -> torch.Tensor:
        return torch.multinomial(self.logits.exp(), 1).squeeze(-1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return self.logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        return -(self.logits.exp() * self.logits).sum(-1)

    def mode(self) -> torch.Tensor:
        return self.logits.argmax(-1)


class _Normal:
    """Diagonal Gaussian; log_prob and entropy sum over the action dimensions."""

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor) -> None:
        self.mean = mean
        self.log_std = log_std.expand_as(mean)

    def sample(self) -> torch.Tensor:
        return self.mean + self.log_std.exp() * torch.randn_like(self.mean)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (self.log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1)

    def mode(self) -> torch.Tensor:
        return self.mean


class TorchBackend:
    """PyTorch on CPU or CUDA. Thread count sized to the process's CPU share."""

    name = "torch"

    def __init__(self, config: TorchConfig) -> None:
        self.config = config
        self.device = self._pick_device(config.device)
        self._device = torch.device(self.device)
        threads = config.threads or cpu_share(config.processes_per_host)
        torch.set_num_threads(threads)
        # acting runs numpy matmuls (inference()): give numpy's BLAS the same CPU share, or
        # OpenBLAS spreads tiny products over every core and spin-waits on the rest
        threadpool_limits(threads, user_api="blas")
        if config.deterministic:
            torch.use_deterministic_algorithms(True)
        # set either way: the flag belongs to the thread (and threads it starts), not the backend
        torch.set_flush_denormal(config.flush_denormal)
        if config.reuse_freed_memory:
            reuse_freed_memory()
        cuda = self._device.type == "cuda"
        self._amp_dtype: torch.dtype | None = None
        self._scaler: Any = None
        amp = backend_common.amp_in_effect(config.amp, cuda, "CUDA", self.device, log)
        if amp is not None:
            self._amp_dtype = torch.bfloat16 if amp == "bf16" else torch.float16
            if amp == "fp16":  # bf16 has float32's exponent range: no scaling needed
                self._scaler = torch.amp.GradScaler("cuda")
        self._pin = cuda and config.pin_memory
        self._staging: dict[tuple[Any, ...], list[Any]] = {}  # key -> [pinned tensor, event]
        self._nvml: Any = None  # (pynvml, handle) once looked up; False when unavailable
        self._int8: weakref.WeakKeyDictionary[nn.Module, Int8CNN] | None = None
        if config.int8_acting and not cuda:
            reason = int8.supported()
            if reason is not None:
                raise ConfigError(f"[backend] int8_acting = true, but {reason}; set it false.")
            self._int8 = weakref.WeakKeyDictionary()
        log.info(
            "torch %s on %s with %d threads%s",
            torch.__version__,
            self.device,
            threads,
            f", amp {config.amp}" if self._amp_dtype is not None else "",
        )

    @staticmethod
    def _pick_device(requested: str) -> str:
        if requested == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(
                f"[backend] device = {requested!r} but CUDA is not available to torch "
                f"{torch.__version__}. Use device = 'auto' or 'cpu'."
            )
        if requested != "cpu" and not requested.startswith("cuda"):
            raise ConfigError(
                f"[backend] device = {requested!r} is not 'auto', 'cpu', 'cuda' or 'cuda:N'."
            )
        return requested

    # --- models ---------------------------------------------------------------------------
    def mlp(
        self,
        in_dim: int,
        hidden: Sequence[int],
        out_dim: int,
        *,
        activation: str = "tanh",
        out_gain: float = 1.0,
        activate_output: bool = False,
    ) -> nn.Module:
        act = backend_common.activation_class(_ACTIVATIONS, activation)
        layers: list[nn.Module] = []
        last = in_dim
        for width in hidden:
            layers += [_init(nn.Linear(last, width), math.sqrt(2)), _activation(act)]
            last = width
        layers.append(_init(nn.Linear(last, out_dim), out_gain))
        if activate_output:
            layers.append(_activation(act))
        return nn.Sequential(nn.Flatten(), *layers).to(self._device)

    def parallel_mlp(
        self,
        in_dim: int,
        hidden: Sequence[int],
        out_dims: Sequence[int],
        *,
        activation: str = "tanh",
        out_gains: Sequence[float] | None = None,
    ) -> nn.Module:
        act = backend_common.activation_class(_ACTIVATIONS, activation)
        gains = backend_common.out_gains_or_ones(out_gains, out_dims)
        return _ParallelMLP(in_dim, list(hidden), list(out_dims), act(), gains).to(self._device)

    def cnn(
        self,
        in_shape: Sequence[int],
        out_dim: int = 512,
        *,
        channels: Sequence[int] = (32, 64, 64),
        kernels: Sequence[int] = (8, 4, 3),
        strides: Sequence[int] = (4, 2, 1),
        scale: float = 1.0 / 255.0,
    ) -> nn.Module:
        shape, layers = backend_common.cnn_layers(in_shape, channels, kernels, strides)
        net = _CNN(shape, out_dim, layers, scale).to(self._device)
        if self._device.type == "cpu":
            # oneDNN's convolutions run on channels-last (NHWC) tensors without reordering:
            # Nature CNN forward + backward at batch 128, one thread, 124 -> 79 ms; acting at
            # batch 4-32 about the same (docs/benchmarks.md). CUDA keeps NCHW (unmeasured)
            net.channels_last = True
            net.convs.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        return net

    def recurrent(self, kind: str, in_dim: int, hidden_dim: int) -> nn.Module:
        sequences.state_dim(kind, hidden_dim)  # (checks the kind)
        return Recurrent(kind, in_dim, hidden_dim).to(self._device)

    def inference(self, model: Any) -> Callable[..., Any]:
        """Numpy forward passes for the networks this backend builds: for CartPole-sized
        batches a numpy matmul chain costs a fraction of torch's per-operation overhead
        (measured: one 8-observation PPO action 257 -> 58 us). A :meth:`recurrent` layer's
        copy steps one time step, ``(x, state) -> (out, state)``. Other modules fall back to
        the torch forward."""
        if isinstance(model, Recurrent):
            w = dict(model.rnn.named_parameters())
            return numpy_nets.recurrent_step(
                model.kind,
                _np32(w["weight_ih_l0"]).T,
                _np32(w["bias_ih_l0"]),
                _np32(w["weight_hh_l0"]).T,
                _np32(w["bias_hh_l0"]),
            )
        if isinstance(model, _CNN) and self._int8 is not None:
            copy = self._int8.get(model)
            if copy is None:
                copy = self._int8[model] = Int8CNN(model)
            else:
                copy.load()  # the trunk's current weights (a refresh after set_weights)
            return copy
        if isinstance(model, _ParallelMLP) and type(model.act) in _ACTIVATION_NAMES:
            return _numpy_parallel(model)
        if isinstance(model, nn.Sequential) and all(
            isinstance(m, nn.Flatten | nn.Linear) or type(m) in _ACTIVATION_NAMES for m in model
        ):
            return _numpy_sequential(model)

        return numpy_nets.framework_forward(model, self.tensor, self.numpy, torch.no_grad)

    def group(self, **models: Any) -> nn.ModuleDict:
        return nn.ModuleDict(models)

    # --- tensors --------------------------------------------------------------------------
    def tensor(self, x: Any, dtype: str = "float32") -> torch.Tensor:
        arr = np.asarray(x)
        if self._pin and arr.nbytes >= PIN_MIN_BYTES and arr.dtype != object:
            return self._staged(arr, _DTYPES[dtype])
        return torch.as_tensor(arr, dtype=_DTYPES[dtype], device=self._device)

    def _staged(self, arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        """``arr`` on the CUDA device: copied into a pinned buffer kept for its shape and
        dtype, sent asynchronously in its own dtype (uint8 frames move a quarter of the
        float32 bytes) and converted there. Kernels that use the result run after the copy
        on the same stream; the buffer is refilled only once that copy has finished."""
        key = (arr.shape, arr.dtype.str)
        entry = self._staging.get(key)
        if entry is None:
            if len(self._staging) >= MAX_STAGING:
                self._staging.clear()  # (torch keeps a buffer alive until its copies finish)
            source_dtype = torch.from_numpy(np.empty(0, arr.dtype)).dtype
            entry = [torch.empty(arr.shape, dtype=source_dtype, pin_memory=True), None]
            self._staging[key] = entry
        host, done = entry
        if done is not None:
            done.synchronize()
        np.copyto(host.numpy(), arr, casting="no")
        out: torch.Tensor = host.to(self._device, non_blocking=True)
        done = entry[1] = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record()
        return out if out.dtype == dtype else out.to(dtype)

    def numpy(self, x: torch.Tensor) -> np.ndarray:
        x = x.detach()
        if x.dtype in _LOW_PRECISION:  # (an amp forward's output; numpy has no bfloat16)
            x = x.float()
        return x.cpu().numpy()

    def no_grad(self) -> AbstractContextManager[Any]:
        return torch.no_grad()

    @contextlib.contextmanager
    def frozen(self, *models: Any) -> Iterator[None]:
        params = [
            p
            for m in models
            for p in ([m] if isinstance(m, nn.Parameter) else m.parameters())
            if p.requires_grad
        ]
        for p in params:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in params:
                p.requires_grad_(True)

    def autocast(self) -> AbstractContextManager[Any]:
        if self._amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast("cuda", dtype=self._amp_dtype)

    def gather(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return x.gather(-1, index.long().unsqueeze(-1)).squeeze(-1)

    def clip(self, x: torch.Tensor, low: float, high: float) -> torch.Tensor:
        return x.clamp(low, high)

    def minimum(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.minimum(a, b)

    def maximum(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.maximum(a, b)

    def exp(self, x: torch.Tensor) -> torch.Tensor:
        return x.exp()

    def log(self, x: torch.Tensor) -> torch.Tensor:
        return x.log()

    def tanh(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)

    def softplus(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.softplus(x)

    def concat(self, xs: Sequence[torch.Tensor], axis: int = -1) -> torch.Tensor:
        return torch.cat(list(xs), dim=axis)

    def mean(self, x: torch.Tensor, axis: int | None = None) -> torch.Tensor:
        return x.mean() if axis is None else x.mean(dim=axis)

    def sum(self, x: torch.Tensor, axis: int | None = None) -> torch.Tensor:
        return x.sum() if axis is None else x.sum(dim=axis)

    def max(self, x: torch.Tensor, axis: int) -> torch.Tensor:
        return x.max(dim=axis).values

    def argmax(self, x: torch.Tensor, axis: int) -> torch.Tensor:
        return x.argmax(dim=axis)

    def mse(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(a, b, reduction="none")

    def smooth_l1(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return nn.functional.smooth_l1_loss(a, b, reduction="none")

    def item(self, x: torch.Tensor) -> float:
        return float(x.item())

    # --- distributions --------------------------------------------------------------------
    def categorical(self, logits: torch.Tensor) -> _Categorical:
        return _Categorical(logits)

    def normal(self, mean: torch.Tensor, log_std: torch.Tensor) -> _Normal:
        return _Normal(mean, log_std)

    def parameter(self, value: np.ndarray) -> nn.Parameter:
        return nn.Parameter(torch.as_tensor(value, dtype=torch.float32, device=self._device))

    @torch.no_grad()
    def assign(self, parameter: nn.Parameter, value: np.ndarray) -> None:
        parameter.copy_(torch.as_tensor(value, dtype=parameter.dtype))

    # --- training -------------------------------------------------------------------------
    def optimizer(self, *models: Any, lr: float, eps: float = 1e-8) -> torch.optim.Adam:
        _skip_dynamo_import()
        params: list[nn.Parameter] = []
        for m in models:
            params += [m] if isinstance(m, nn.Parameter) else list(m.parameters())
        # fused: one kernel for the whole update instead of ~10 per tensor (Adam step 958 ->
        # 335 us for PPO's two 64x64 MLPs on CPU; CUDA gains likewise)
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)

    def update(
        self,
        optimizer: torch.optim.Optimizer,
        loss: torch.Tensor,
        *,
        max_grad_norm: float | None = None,
    ) -> float:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for p in params:  # zero_grad(set_to_none=True) without its profiler and dynamo wrappers
            p.grad = None
        scaler = self._scaler
        if scaler is not None:  # fp16: scale the loss, unscale before the norm is taken
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()  # type: ignore[no-untyped-call]
        grads = [p.grad for p in params if p.grad is not None]
        with torch.no_grad():
            # clip_grad_norm_'s arithmetic (same formula and eps) without its per-call
            # device/dtype grouping: ~30 us instead of ~125 us for PPO's six tensors
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
            if max_grad_norm is not None:
                coef = torch.clamp(max_grad_norm / (norm + 1e-6), max=1.0)
                torch._foreach_mul_(grads, coef)
            if scaler is not None:
                scaler.step(optimizer)  # skipped when a gradient overflowed
                scaler.update()
            else:
                _plain_step(type(optimizer))(optimizer)  # type: ignore[arg-type]
        return float(norm)

    def set_lr(self, optimizer: torch.optim.Optimizer, lr: float) -> None:
        for group in optimizer.param_groups:
            group["lr"] = lr

    @torch.no_grad()
    def copy_weights(self, target: nn.Module, source: nn.Module, tau: float = 1.0) -> None:
        t_params: list[torch.Tensor] = list(target.parameters())
        s_params: list[torch.Tensor] = list(source.parameters())
        if tau >= 1.0:
            torch._foreach_copy_(t_params, s_params)
        else:
            torch._foreach_lerp_(t_params, s_params, tau)

    def device_stats(self) -> dict[str, float]:
        """The learner's CUDA device: torch's allocations, and the whole device's utilisation
        and memory through NVML (``pip install nvidia-ml-py``, the gpu-monitor extra) when it
        is there. Empty on CPU."""
        if self._device.type != "cuda":
            return {}
        index = (
            self._device.index if self._device.index is not None else torch.cuda.current_device()
        )
        mib = 2**20
        stats = {
            "gpu/torch_allocated_mb": torch.cuda.memory_allocated(index) / mib,
            "gpu/torch_reserved_mb": torch.cuda.memory_reserved(index) / mib,
            "gpu/torch_peak_mb": torch.cuda.max_memory_allocated(index) / mib,
        }
        if self._nvml is None:
            self._nvml = _nvml_handle(index) or False
        if self._nvml:
            nvml, handle = self._nvml
            with contextlib.suppress(Exception):
                stats["gpu/util"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                stats["gpu/memory_used_mb"] = memory.used / mib
                stats["gpu/memory_total_mb"] = memory.total / mib
        return stats

    # --- state ----------------------------------------------------------------------------
    def get_weights(self, model: nn.Module) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}

    def set_weights(self, model: nn.Module, weights: Mapping[str, np.ndarray]) -> None:
        state = {k: torch.as_tensor(v) for k, v in weights.items()}
        model.load_state_dict(state)

    def state(self, obj: Any) -> Any:
        # a copy, not state_dict()'s live views: a snapshot must not follow later updates
        if isinstance(obj, nn.Parameter):
            return obj.detach().cpu().clone()
        return copy.deepcopy(obj.state_dict())

    def load_state(self, obj: Any, state: Any) -> None:
        if isinstance(obj, nn.Parameter):
            with torch.no_grad():
                obj.copy_(state)
            return
        obj.load_state_dict(state)

    def save(self, payload: Mapping[str, Any], path: Path) -> None:
        # arrays + JSON (harness.safestate), never a pickle: run directories are shared
        save_payload(payload, path, self._device)

    def load(self, path: Path) -> dict[str, Any]:
        return load_payload(path, self._device)

    def load_legacy(self, path: Path) -> dict[str, Any]:
        """A ``torch.save`` checkpoint of an earlier harness version (UNPICKLES: only
        ``harness checkpoint convert --trust`` calls it)."""
        return load_legacy(path)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def rng_state(self) -> Any:
        state: dict[str, Any] = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def set_rng_state(self, state: Any) -> None:
        torch.set_rng_state(state["cpu"].cpu())
        if "cuda" in state and torch.cuda.is_available():
            # (a checkpoint loaded with map_location=cuda brings these onto the GPU: torch
            # wants them as CPU byte tensors)
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _nvml_handle(index: int) -> tuple[Any, Any] | None:
    """(pynvml, the NVML handle of torch's CUDA device ``index``) or None. Matched by UUID:
    CUDA_VISIBLE_DEVICES renumbers torch's devices, NVML's numbers are the machine's."""
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = f"GPU-{torch.cuda.get_device_properties(index).uuid}"
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        except Exception:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return pynvml, handle
    except Exception as exc:  # no nvidia-ml-py, no driver library, a virtual device...
        log.info("GPU utilisation is not reported: NVML is unavailable (%s)", exc)
        return None


_ACTIVATION_NAMES: dict[type[nn.Module], str] = {cls: name for name, cls in _ACTIVATIONS.items()}


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


@functools.cache
def reuse_freed_memory() -> bool:
    """Keep freed host memory in this process for reuse (see ``TorchConfig.reuse_freed_memory``):
    blocks below 32 MiB (glibc's largest heap threshold) come from the heap, and up to 256 MiB
    of free heap stays mapped. Setting either also ends glibc's sliding thresholds, which
    otherwise trim the heap again whenever its free top passes twice the last big block.
    True when glibc took both settings."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(M_TRIM_THRESHOLD, 256 << 20))


def _activation(cls: type[nn.Module]) -> nn.Module:
    """The activation after a linear layer, in place where torch's module offers it (ReLU, ELU;
    see ``_IN_PLACE``)."""
    return cls(inplace=True) if cls in (nn.ReLU, nn.ELU) else cls()


def _np32(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous float32 copy (of a transposed view too: one copy, not two)."""
    return t.detach().to("cpu", torch.float32).numpy().copy()


def _numpy_parallel(model: _ParallelMLP) -> Callable[[Any], list[np.ndarray]]:
    return numpy_nets.parallel(
        [_np32(w) for w in model.weights],
        [_np32(b) for b in model.biases],
        _ACTIVATION_NAMES[type(model.act)],
        model.out_dims,
    )


def _numpy_sequential(model: nn.Sequential) -> Callable[[np.ndarray], np.ndarray]:
    steps: list[tuple[np.ndarray, np.ndarray] | str] = []
    for m in model:
        if isinstance(m, nn.Linear):
            steps.append((_np32(m.weight.T), _np32(m.bias)))  # torch keeps (out, in)
        elif not isinstance(m, nn.Flatten):
            steps.append(_ACTIVATION_NAMES[type(m)])
    return numpy_nets.sequential(steps)


@functools.cache
def _plain_step(cls: type[torch.optim.Optimizer]) -> Callable[[torch.optim.Optimizer], Any]:
    """The optimiser's own ``step`` without torch's wrappers. ``Optimizer.step`` is wrapped
    twice: step hooks and a profiler range (harness registers no hooks), then
    ``_use_grad_for_differentiable``, which imports ``torch._dynamo`` on every call (1.2-1.4 s
    the first time) to insert graph breaks for compilation and sets the grad mode. Calling the
    innermost function under ``no_grad`` does the same update: ~17 us for PPO's fused Adam
    instead of ~104 us, and no dynamo import (tests compare both paths parameter by parameter).
    """
    fn: Any = cls.step
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn  # type: ignore[no-any-return]


def _skip_dynamo_import() -> None:
    """Several ``torch.optim.Optimizer`` methods (``add_param_group``, ``zero_grad``,
    ``state_dict``, ``load_state_dict``) are wrapped in torch's lazy ``_disable_dynamo``, whose
    first call imports ``torch._dynamo``: 1.2-1.4 s of every process start here (each farm
    actor would pay it too), only to exclude those methods from compilation. harness never
    compiles an optimiser, so pre-seed each wrapper's cache with the plain function, unless
    dynamo is already loaded (then the real wrappers are cheap and kept). Wrappers are found by
    their code object, so a torch without them is left alone."""
    import sys

    from torch import _compile

    if "torch._dynamo" in sys.modules:
        return
    lazy_code = _compile._disable_dynamo(lambda: None).__code__
    for method in vars(torch.optim.Optimizer).values():
        fn = getattr(method, "__wrapped__", None)
        lazy = getattr(method, "__code__", None) is lazy_code
        if lazy and fn is not None and not hasattr(fn, "__dynamo_disable"):
            fn.__dynamo_disable = fn


class _ParallelMLP(nn.Module):
    """k MLPs with identical hidden widths as stacked weights ``(k, fan_in, fan_out)``; one
    ``baddbmm`` per layer evaluates all of them. Each member is initialised exactly like
    :meth:`TorchBackend.mlp` (orthogonal, gain sqrt(2), its own output gain); the output layer
    is padded to the widest member with zero columns that are sliced away."""

    def __init__(
        self,
        in_dim: int,
        hidden: list[int],
        out_dims: list[int],
        act: nn.Module,
        gains: list[float],
    ) -> None:
        super().__init__()
        self.out_dims = out_dims
        self.act = act
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        k, layout = len(out_dims), backend_common.parallel_layout(in_dim, hidden, out_dims, gains)
        for fan_in, fan_out, members in layout:
            w = torch.zeros(k, fan_in, fan_out)
            for j, (width, gain) in enumerate(members):
                block = torch.empty(width, fan_in)
                nn.init.orthogonal_(block, gain)
                w[j, :, :width] = block.T
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.zeros(k, 1, fan_out)))

    def forward(
        self, x: torch.Tensor | Sequence[torch.Tensor], member: int | None = None
    ) -> list[torch.Tensor]:
        weights, biases, dims = list(self.weights), list(self.biases), self.out_dims
        if member is not None:  # that member's weight slices alone, as a stack of one
            one_batch = isinstance(x, torch.Tensor)
            weights, biases, dims = backend_common.member_stacks(
                member, one_batch, weights, biases, dims
            )
        if isinstance(x, torch.Tensor):
            h = x.flatten(1).unsqueeze(0).expand(len(dims), -1, -1)
        else:  # one input per member
            h = torch.stack([xi.flatten(1) for xi in x])
        last, act_ = len(weights) - 1, _IN_PLACE[type(self.act)]
        for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
            h = torch.baddbmm(b, h, w)
            if i < last:
                h = act_(h)
        return [h[j, :, :d] for j, d in enumerate(dims)]


class _CNN(nn.Module):
    """See :meth:`TorchBackend.cnn`: scaled input, ReLU convolutions, a ReLU linear layer."""

    def __init__(
        self,
        in_shape: tuple[int, ...],
        out_dim: int,
        layers: list[tuple[int, int, int]],
        scale: float,
    ) -> None:
        super().__init__()
        self.scale = scale
        self.channels_last = False  # set by TorchBackend.cnn with the weights' layout
        convs: list[nn.Module] = []
        specs, flat = backend_common.conv_stack(in_shape, layers)
        for c, out, kernel, stride in specs:
            conv = nn.Conv2d(c, out, kernel, stride)
            nn.init.orthogonal_(conv.weight, math.sqrt(2))
            assert conv.bias is not None
            nn.init.zeros_(conv.bias)
            convs += [conv, nn.ReLU()]
        self.convs = nn.Sequential(*convs)
        self.fc = _init(nn.Linear(flat, out_dim), math.sqrt(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:  # reordered while still bytes, before the float conversion
            x = x.contiguous(memory_format=torch.channels_last)
        if not x.is_floating_point():  # uint8 frames: converted here (on the device)
            x = x.float()
        return torch.relu(self.fc(self.convs(x * self.scale).flatten(1)))


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer
