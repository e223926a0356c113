"""The PaddlePaddle implementation of :class:`harness.api.Backend`.

Written against the same interface as the torch backend, so every algorithm file runs on it
unchanged. Where the two frameworks differ, the difference is absorbed here:

* ``paddle.nn.Linear`` keeps its weight as ``(in, out)`` (torch: ``(out, in)``); state-dict
  keys are the same (``"1.weight"``), shapes transposed. A :meth:`PaddleBackend.recurrent`
  layer's weights have torch's keys and shapes as they are (harness_paddle.recurrent).
* paddle is imported through harness_paddle.framework (the MKL variable set before it).
* Adam's state is keyed by paddle's global parameter names (``linear_12.w_0_moment1_0``), which
  depend on how many layers the process built before; :meth:`PaddleBackend.state` renames
  them by position so a checkpoint restores into freshly built networks of any process.
* Paddle accumulates gradients until ``clear_grad``; :meth:`PaddleBackend.update` clears first.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from harness import backend_common, numpy_nets
from harness.cpus import cpu_share
from harness.errors import ConfigError
from harness_paddle.config import PaddleConfig
from harness_paddle.framework import F, core, mkl_cpu_type, nn, paddle
from harness_paddle.recurrent import Recurrent
from harness_paddle.state import load_legacy, load_payload, save_payload

__all__ = ["PIN_MIN_BYTES", "PaddleBackend", "mkl_cpu_type"]

log = logging.getLogger(__name__)

_ACTIVATIONS: dict[str, type[nn.Layer]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}
_ACTIVATION_NAMES = {cls: name for name, cls in _ACTIVATIONS.items()}
_DTYPES = {"float32": "float32", "int64": "int64", "bool": "bool", "uint8": "uint8"}
_LOW_PRECISION = (paddle.bfloat16, paddle.float16)
PIN_MIN_BYTES = 256 * 1024
"""Host arrays at least this big go to a GPU through pinned memory."""


def _orthogonal(gain: float) -> Any:
    return nn.initializer.Orthogonal(gain=gain)


class _Categorical:
    def __init__(self, logits: paddle.Tensor) -> None:
        self.logits = F.log_softmax(logits, axis=-1)

    def sample(self) -> paddle.Tensor:
        return paddle.multinomial(self.logits.exp(), 1).squeeze(-1)

    def log_prob(self, actions: paddle.Tensor) -> paddle.Tensor:
        return _take(self.logits, actions)

    def entropy(self) -> paddle.Tensor:
        return -(self.logits.exp() * self.logits).sum(-1)

    def mode(self) -> paddle.Tensor:
        return self.logits.argmax(-1)


class _Normal:
    """Diagonal Gaussian; log_prob and entropy sum over the action dimensions."""

    def __init__(self, mean: paddle.Tensor, log_std: paddle.Tensor) -> None:
        self.mean = mean
        self.log_std = paddle.broadcast_to(log_std, mean.shape)

    def sample(self) -> paddle.Tensor:
        noise = paddle.standard_normal(self.mean.shape, dtype=self.mean.dtype)
        return self.mean + self.log_std.exp() * noise

    def log_prob(self, actions: paddle.Tensor) -> paddle.Tensor:
        z = (actions - self.mean) * paddle.exp(-self.log_std)
        return (-0.5 * z * z - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> paddle.Tensor:
        return (self.log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1)

    def mode(self) -> paddle.Tensor:
        return self.mean


def _params(models: Sequence[Any]) -> list[Any]:
    """Every trainable tensor of ``models`` (Layers or lone parameters), each once, in order."""
    out: list[Any] = []
    seen: set[int] = set()
    for m in models:
        for p in [m] if isinstance(m, paddle.Tensor) else m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


class PaddleBackend:
    """PaddlePaddle (dynamic graph) on CPU or CUDA. Thread count sized to the CPU share."""

    name = "paddle"

    def __init__(self, config: PaddleConfig) -> None:
        self.config = config
        self.device = self._pick_device(config.device)
        paddle.set_device(self.device)
        threads = config.threads or cpu_share(config.processes_per_host)
        core.set_num_threads(threads)
        threadpool_limits(threads, user_api="blas")  # numpy acting (inference()) too
        if config.deterministic:
            paddle.set_flags({"FLAGS_cudnn_deterministic": True})
        gpu = self.device.startswith("gpu")
        self._amp_dtype: str | None = None
        self._scaler: Any = None
        amp = backend_common.amp_in_effect(config.amp, gpu, "GPU", self.device, log)
        if amp is not None:
            self._amp_dtype = "bfloat16" if amp == "bf16" else "float16"
            if amp == "fp16":
                self._scaler = paddle.amp.GradScaler(init_loss_scaling=2.0**16)
        self._pin = gpu and config.pin_memory
        mkl = os.environ.get("MKL_DEBUG_CPU_TYPE")
        log.info(
            "paddle %s on %s with %d threads%s%s",
            paddle.__version__,
            self.device,
            threads,
            f", amp {config.amp}" if self._amp_dtype is not None else "",
            f", MKL_DEBUG_CPU_TYPE={mkl}" if mkl else "",
        )

    @staticmethod
    def _pick_device(requested: str) -> str:
        has_gpu = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
        if requested == "auto":
            return "gpu:0" if has_gpu else "cpu"
        if requested == "cpu":
            return "cpu"
        kind, _, index = requested.partition(":")
        if kind not in ("gpu", "cuda") or (index and not index.isdigit()):
            raise ConfigError(
                f"[backend] device = {requested!r} is not 'auto', 'cpu', 'gpu', 'gpu:N' "
                f"(or 'cuda', 'cuda:N')."
            )
        if not has_gpu:
            raise ConfigError(
                f"[backend] device = {requested!r} but this paddle {paddle.__version__} build "
                f"sees no CUDA GPU (CPU wheel, or no device). Use device = 'auto' or 'cpu', or "
                f"install 'harness[paddle-gpu]'."
            )
        return f"gpu:{index or 0}"

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
    ) -> nn.Sequential:
        act = backend_common.activation_class(_ACTIVATIONS, activation)
        layers: list[nn.Layer] = [_Flatten()]
        last = in_dim
        for width in hidden:
            layers += [_linear(last, width, math.sqrt(2)), act()]
            last = width
        layers.append(_linear(last, out_dim, out_gain))
        if activate_output:
            layers.append(act())
        return nn.Sequential(*layers)

    def parallel_mlp(
        self,
        in_dim: int,
        hidden: Sequence[int],
        out_dims: Sequence[int],
        *,
        activation: str = "tanh",
        out_gains: Sequence[float] | None = None,
    ) -> nn.Layer:
        act = backend_common.activation_class(_ACTIVATIONS, activation)
        gains = backend_common.out_gains_or_ones(out_gains, out_dims)
        return _ParallelMLP(in_dim, list(hidden), list(out_dims), act(), gains)

    def cnn(
        self,
        in_shape: Sequence[int],
        out_dim: int = 512,
        *,
        channels: Sequence[int] = (32, 64, 64),
        kernels: Sequence[int] = (8, 4, 3),
        strides: Sequence[int] = (4, 2, 1),
        scale: float = 1.0 / 255.0,
    ) -> nn.Layer:
        shape, layers = backend_common.cnn_layers(in_shape, channels, kernels, strides)
        return _CNN(shape, out_dim, layers, scale)

    def recurrent(self, kind: str, in_dim: int, hidden_dim: int) -> nn.Layer:
        return Recurrent(kind, in_dim, hidden_dim)

    def inference(self, model: Any) -> Callable[..., Any]:
        """Numpy forward passes for the MLPs and recurrent layers this backend builds (see
        harness.numpy_nets; a :meth:`recurrent` layer's copy steps one time step, ``(x, state)
        -> (output, state)``); other layers fall back to a paddle forward under no_grad."""
        if isinstance(model, Recurrent):
            return numpy_nets.recurrent_step(model.kind, *model.numpy_weights())
        if isinstance(model, _ParallelMLP) and type(model.act) in _ACTIVATION_NAMES:
            return numpy_nets.parallel(
                [_np32(w) for w in model.weights],
                [_np32(b) for b in model.biases],
                _ACTIVATION_NAMES[type(model.act)],
                model.out_dims,
            )
        if isinstance(model, nn.Sequential) and all(
            isinstance(m, nn.Flatten | nn.Linear) or type(m) in _ACTIVATION_NAMES
            for m in model.children()
        ):
            steps: list[tuple[np.ndarray, np.ndarray] | str] = []
            for m in model.children():
                if isinstance(m, nn.Linear):
                    steps.append((_np32(m.weight), _np32(m.bias)))  # already (in, out)
                elif not isinstance(m, nn.Flatten):
                    steps.append(_ACTIVATION_NAMES[type(m)])
            return numpy_nets.sequential(steps)

        return numpy_nets.framework_forward(model, self.tensor, self.numpy, paddle.no_grad)

    def group(self, **models: Any) -> nn.LayerDict:
        return nn.LayerDict(models)

    # --- tensors --------------------------------------------------------------------------
    def tensor(self, x: Any, dtype: str = "float32") -> paddle.Tensor:
        arr = np.asarray(x)
        if self._pin and arr.nbytes >= PIN_MIN_BYTES and arr.dtype != object:
            # pinned host copy in its own dtype (uint8 frames move a quarter of the bytes),
            # sent asynchronously, converted on the device
            host = paddle.to_tensor(arr, place=paddle.CUDAPinnedPlace())
            out = host.cuda(blocking=False)
            return out if arr.dtype == np.dtype(dtype) else out.astype(_DTYPES[dtype])
        if arr.dtype != np.dtype(dtype):
            arr = arr.astype(dtype)
        return paddle.to_tensor(arr)

    def numpy(self, x: paddle.Tensor) -> np.ndarray:
        x = x.detach()
        if x.dtype in _LOW_PRECISION:
            x = x.astype("float32")
        return np.asarray(x.numpy())

    def no_grad(self) -> AbstractContextManager[Any]:
        context: AbstractContextManager[Any] = paddle.no_grad()
        return context

    @contextlib.contextmanager
    def frozen(self, *models: Any) -> Iterator[None]:
        params = [p for p in _params(models) if not p.stop_gradient]
        for p in params:
            p.stop_gradient = True
        try:
            yield
        finally:
            for p in params:
                p.stop_gradient = False

    def autocast(self) -> AbstractContextManager[Any]:
        if self._amp_dtype is None:
            return contextlib.nullcontext()
        context: AbstractContextManager[Any] = paddle.amp.auto_cast(
            enable=True, level="O1", dtype=self._amp_dtype
        )
        return context

    def gather(self, x: paddle.Tensor, index: paddle.Tensor) -> paddle.Tensor:
        return _take(x, index)

    def clip(self, x: paddle.Tensor, low: float, high: float) -> paddle.Tensor:
        return paddle.clip(x, low, high)

    def minimum(self, a: paddle.Tensor, b: paddle.Tensor) -> paddle.Tensor:
        return paddle.minimum(a, b)

    def maximum(self, a: paddle.Tensor, b: paddle.Tensor) -> paddle.Tensor:
        return paddle.maximum(a, b)

    def exp(self, x: paddle.Tensor) -> paddle.Tensor:
        return paddle.exp(x)

    def log(self, x: paddle.Tensor) -> paddle.Tensor:
        return paddle.log(x)

    def tanh(self, x: paddle.Tensor) -> paddle.Tensor:
        return paddle.tanh(x)

    def softplus(self, x: paddle.Tensor) -> paddle.Tensor:
        return F.softplus(x)

    def concat(self, xs: Sequence[paddle.Tensor], axis: int = -1) -> paddle.Tensor:
        return paddle.concat(list(xs), axis=axis)

    def mean(self, x: paddle.Tensor, axis: int | None = None) -> paddle.Tensor:
        return x.mean() if axis is None else x.mean(axis=axis)

    def sum(self, x: paddle.Tensor, axis: int | None = None) -> paddle.Tensor:
        return x.sum() if axis is None else x.sum(axis=axis)

    def max(self, x: paddle.Tensor, axis: int) -> paddle.Tensor:
        return x.max(axis=axis)

    def argmax(self, x: paddle.Tensor, axis: int) -> paddle.Tensor:
        return x.argmax(axis=axis)

    def mse(self, a: paddle.Tensor, b: paddle.Tensor) -> paddle.Tensor:
        d = a - b
        return d * d

    def smooth_l1(self, a: paddle.Tensor, b: paddle.Tensor) -> paddle.Tensor:
        d = a - b
        ad = d.abs()
        return paddle.where(ad < 1.0, 0.5 * d * d, ad - 0.5)

    def item(self, x: paddle.Tensor) -> float:
        return float(x.item())

    # --- distributions --------------------------------------------------------------------
    def categorical(self, logits: paddle.Tensor) -> _Categorical:
        return _Categorical(logits)

    def normal(self, mean: paddle.Tensor, log_std: paddle.Tensor) -> _Normal:
        return _Normal(mean, log_std)

    def parameter(self, value: np.ndarray) -> Any:
        value = np.asarray(value, np.float32)
        return paddle.create_parameter(
            list(value.shape), "float32", default_initializer=nn.initializer.Assign(value)
        )

    def assign(self, parameter: Any, value: np.ndarray) -> None:
        with paddle.no_grad():
            parameter.set_value(np.asarray(value, np.float32).reshape(parameter.shape))

    # --- training -------------------------------------------------------------------------
    def optimizer(self, *models: Any, lr: float, eps: float = 1e-8) -> paddle.optimizer.Adam:
        params = _params(models)
        # paddle's Adam: lr_t = lr sqrt(1 - b2^t) / (1 - b1^t), eps scaled by sqrt(1 - b2^t):
        # algebraically torch's update (checked against torch in tests/unit/test_backend_parity.py)
        # use_multi_tensor: one merged kernel for all the tensors (a SAC critic's step 680 ->
        # 230 us on CPU), the same arithmetic to 1e-7; see update() for when it is used
        opt = paddle.optimizer.Adam(
            learning_rate=lr, parameters=params, epsilon=eps, use_multi_tensor=True
        )
        opt._harness_params = params  # (kept on the optimiser: it lives and dies with it)
        return opt

    def update(
        self,
        optimizer: paddle.optimizer.Optimizer,
        loss: paddle.Tensor,
        *,
        max_grad_norm: float | None = None,
    ) -> float:
        params = optimizer._harness_params
        optimizer.clear_grad(set_to_zero=False)
        scaler = self._scaler
        if scaler is not None:  # fp16: scale the loss, unscale before the norm is taken
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return 0.0
        # paddle's merged Adam lists the parameters that had gradients at its first merged
        # step and pairs every later step's gradients with that list by position: a step where
        # some parameter has none (an unused head) fails, or with equal sizes would update the
        # wrong tensors. Such steps take the per-tensor kernels, which read and write the same
        # moment and beta-power tensors (tests/unit/test_paddle_backend.py).
        optimizer._use_multi_tensor = len(grads) == len(params)
        with paddle.no_grad():
            # torch.nn.utils.clip_grad_norm_'s arithmetic: global L2 norm, coef = max / (norm
            # + 1e-6) clamped at 1. The norm as sqrt(sum of squares): paddle's CPU p_norm
            # kernel made one linalg.norm per gradient 1.9 ms of a 38 ms SAC update
            # (tools/bench_backends.py); this is ~10x cheaper, same value
            norm = paddle.add_n([(g * g).sum() for g in grads]).sqrt()
            if max_grad_norm is not None:
                coef = paddle.clip(max_grad_norm / (norm + 1e-6), max=1.0)
                for g in grads:
                    g.multiply_(coef)
            if scaler is not None:
                scaler.step(optimizer)  # skipped when a gradient overflowed
                scaler.update()
            else:
                optimizer.step()
        return float(norm.item())

    def set_lr(self, optimizer: paddle.optimizer.Optimizer, lr: float) -> None:
        optimizer.set_lr(lr)

    def copy_weights(self, target: nn.Layer, source: nn.Layer, tau: float = 1.0) -> None:
        with paddle.no_grad():
            for t, s in zip(target.parameters(), source.parameters(), strict=True):
                if tau >= 1.0:
                    paddle.assign(s, output=t)
                else:  # in place, two kernels (assign of t + tau * (s - t) took four)
                    t.scale_(1.0 - tau).add_(s * tau)

    def device_stats(self) -> dict[str, float]:
        """The learner's GPU: paddle's allocator (``gpu/paddle_*``). Empty on CPU."""
        if not self.device.startswith("gpu"):
            return {}
        mib = 2**20
        cuda = paddle.device.cuda
        return {
            "gpu/paddle_allocated_mb": cuda.memory_allocated(self.device) / mib,
            "gpu/paddle_reserved_mb": cuda.memory_reserved(self.device) / mib,
            "gpu/paddle_peak_mb": cuda.max_memory_allocated(self.device) / mib,
        }

    # --- state ----------------------------------------------------------------------------
    def get_weights(self, model: nn.Layer) -> dict[str, np.ndarray]:
        return {k: np.array(v.numpy(), copy=True) for k, v in model.state_dict().items()}

    def set_weights(self, model: nn.Layer, weights: Mapping[str, np.ndarray]) -> None:
        state = model.state_dict()
        missing = set(state) ^ set(weights)
        if missing:
            raise KeyError(f"set_weights: keys differ from the model's: {sorted(missing)}")
        with paddle.no_grad():
            for key, value in weights.items():
                target = state[key]
                if tuple(target.shape) != tuple(np.shape(value)):
                    raise ValueError(
                        f"set_weights: {key} has shape {tuple(np.shape(value))}, the model's "
                        f"is {tuple(target.shape)}"
                    )
                floating = target.dtype == paddle.float32
                target.set_value(np.asarray(value, np.float32) if floating else np.asarray(value))

    def state(self, obj: Any) -> Any:
        """A snapshot (copies, not live views): a parameter's value, a layer's state dict, or
        an optimiser's state with its parameters named by position (see the module doc)."""
        if isinstance(obj, paddle.Tensor):
            return obj.detach().clone()
        if isinstance(obj, paddle.optimizer.Optimizer):
            names = _positional_names(obj._harness_params)
            return {
                _rename(k, names): v.clone() if isinstance(v, paddle.Tensor) else v
                for k, v in obj.state_dict().items()
            }
        return {k: v.clone() for k, v in obj.state_dict().items()}

    def load_state(self, obj: Any, state: Any) -> None:
        if isinstance(obj, paddle.Tensor):
            with paddle.no_grad():
                obj.set_value(state)
            return
        if isinstance(obj, paddle.optimizer.Optimizer):
            back = {v: k for k, v in _positional_names(obj._harness_params).items()}
            obj.set_state_dict({_rename(k, back): v for k, v in state.items()})
            return
        obj.set_state_dict(dict(state))

    def save(self, payload: Mapping[str, Any], path: Path) -> None:
        # arrays + JSON (harness.safestate), never a pickle: run directories are shared
        save_payload(payload, path, self.device.startswith("gpu"))

    def load(self, path: Path) -> dict[str, Any]:
        return load_payload(path, self.device.startswith("gpu"))

    def load_legacy(self, path: Path) -> dict[str, Any]:
        """A ``paddle.save`` checkpoint of an earlier harness version (UNPICKLES: only
        ``harness checkpoint convert --trust`` calls it)."""
        return load_legacy(path)

    def seed(self, seed: int) -> None:
        paddle.seed(seed)

    def rng_state(self) -> Any:
        state: dict[str, Any] = {"cpu": paddle.get_rng_state("cpu")}
        if self.device.startswith("gpu"):
            state["cuda"] = paddle.get_cuda_rng_state()
        return state

    def set_rng_state(self, state: Any) -> None:
        paddle.set_rng_state(state["cpu"], "cpu")
        if "cuda" in state and self.device.startswith("gpu"):
            paddle.set_cuda_rng_state(state["cuda"])


def _positional_names(params: Sequence[Any]) -> dict[str, str]:
    """paddle's global name of each parameter -> its position in the optimiser (``p3``)."""
    return {p.name: f"p{i}" for i, p in enumerate(params)}


def _rename(key: str, names: Mapping[str, str]) -> str:
    """``linear_3.w_0_moment1_0`` -> ``p0_moment1_0`` for names {linear_3.w_0: p0}."""
    for old in sorted(names, key=len, reverse=True):
        if key.startswith(old + "_"):
            return names[old] + key[len(old) :]
    return key


def _take(x: paddle.Tensor, index: paddle.Tensor) -> paddle.Tensor:
    """``x[..., index]`` along the last axis, one entry per row. ``index_sample`` on a 2-D
    view: 25 us forward on a (64, 2) batch, against 90 us for ``take_along_axis``."""
    if index.dtype != paddle.int64:
        index = index.astype("int64")
    if x.ndim == 2:
        return paddle.index_sample(x, index.unsqueeze(-1)).squeeze(-1)
    rows = paddle.index_sample(x.reshape([-1, x.shape[-1]]), index.reshape([-1, 1]))
    return rows.reshape(index.shape)


def _flat(x: paddle.Tensor) -> paddle.Tensor:
    """``x`` as ``(B, features)``; a batch that already is one is passed as it is (paddle's
    flatten is an operation with a backward node even then, torch's a free view)."""
    return x if x.ndim == 2 else x.flatten(1)


class _Flatten(nn.Flatten):  # type: ignore[misc]
    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return _flat(x)


def _np32(t: paddle.Tensor) -> np.ndarray:
    return np.array(t.detach().astype("float32").numpy(), copy=True)


def _linear(fan_in: int, fan_out: int, gain: float) -> nn.Linear:
    return nn.Linear(
        fan_in,
        fan_out,
        weight_attr=paddle.ParamAttr(initializer=_orthogonal(gain)),
        bias_attr=paddle.ParamAttr(initializer=nn.initializer.Constant(0.0)),
    )


class _ParallelMLP(nn.Layer):  # type: ignore[misc]
    """k MLPs with identical hidden widths as stacked weights ``(k, fan_in, fan_out)``; one
    batched matmul per layer evaluates all of them. Each member is initialised like
    :meth:`PaddleBackend.mlp` (orthogonal, gain sqrt(2), its own output gain); the output layer
    is padded to the widest member with zero columns that are sliced away."""

    def __init__(
        self, in_dim: int, hidden: list[int], out_dims: list[int], act: nn.Layer, gains: list[float]
    ) -> None:
        super().__init__()
        self.out_dims = out_dims
        self.act = act
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        k, layout = len(out_dims), backend_common.parallel_layout(in_dim, hidden, out_dims, gains)
        for fan_in, fan_out, members in layout:
            w = np.zeros((k, fan_in, fan_out), np.float32)
            for j, (width, gain) in enumerate(members):
                block = paddle.create_parameter(
                    [fan_in, width], "float32", default_initializer=_orthogonal(gain)
                )
                w[j, :, :width] = block.numpy()
            self.weights.append(self.create_parameter(list(w.shape), default_initializer=_const(w)))
            b = np.zeros((k, 1, fan_out), np.float32)
            self.biases.append(self.create_parameter(list(b.shape), default_initializer=_const(b)))

    def forward(self, x: Any, member: int | None = None) -> list[paddle.Tensor]:
        weights, biases, dims = list(self.weights), list(self.biases), self.out_dims
        if member is not None:  # that member's weight slices alone, as a stack of one
            one_batch = not isinstance(x, list | tuple)
            weights, biases, dims = backend_common.member_stacks(
                member, one_batch, weights, biases, dims
            )
        # one input per member, or one (B, in) that (k, in, out) weights broadcast to (k, B, out)
        multi = isinstance(x, list | tuple)
        h = paddle.stack([_flat(xi) for xi in x]) if multi else _flat(x)
        last = len(weights) - 1
        for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
            # the bias tiled to the batch, not broadcast: paddle's CPU add that broadcasts a
            # middle axis (k, 1, out) took 1.3 ms on a (2, 256, 256) output, 35x a same-shape
            # add; a SAC critic's forward and backward went from 8.1 to 5.0 ms (AMD EPYC)
            h = paddle.matmul(h, w) + paddle.tile(b, [1, h.shape[-2], 1])
            if i < last:
                h = self.act(h)
        return [h[j, :, :d] for j, d in enumerate(dims)]


class _CNN(nn.Layer):  # type: ignore[misc]
    """See :meth:`harness.api.Backend.cnn`: scaled input, ReLU convolutions, a ReLU linear."""

    def __init__(
        self,
        in_shape: tuple[int, ...],
        out_dim: int,
        layers: list[tuple[int, int, int]],
        scale: float,
    ) -> None:
        super().__init__()
        self.scale = scale
        convs: list[nn.Layer] = []
        specs, flat = backend_common.conv_stack(in_shape, layers)
        for c, out, kernel, stride in specs:
            conv = nn.Conv2D(
                c,
                out,
                kernel,
                stride,
                weight_attr=paddle.ParamAttr(initializer=_orthogonal(math.sqrt(2))),
                bias_attr=paddle.ParamAttr(initializer=nn.initializer.Constant(0.0)),
            )
            convs += [conv, nn.ReLU()]
        self.convs = nn.Sequential(*convs)
        self.fc = _linear(flat, out_dim, math.sqrt(2))

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if not paddle.is_floating_point(x):  # uint8 frames: converted here (on the device)
            x = x.astype("float32")
        return F.relu(self.fc(self.convs(x * self.scale).flatten(1)))


def _const(value: np.ndarray) -> Any:
    return nn.initializer.Assign(value)
