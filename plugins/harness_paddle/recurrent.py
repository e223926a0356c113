"""The paddle backend's :meth:`harness.api.Backend.recurrent` layer: paddle's fused LSTM / GRU
(``paddle.nn.LSTM`` / ``paddle.nn.GRU``, one layer, time-major, its ``rnn`` kernel on CPU and
cuDNN on GPU) over whole sequences, with the state as one ``(B, S)`` tensor and episode starts
inside the sequences run as segments side by side (:func:`harness.sequences.plan_segments`).

Laid out like the torch backend's layer, so weights travel between the two unchanged: the same
state-dict keys (``rnn.weight_ih_l0``, ``rnn.weight_hh_l0``, ``rnn.bias_ih_l0``,
``rnn.bias_hh_l0``), the same shapes (paddle's RNN weights are ``(G * H, fan_in)`` like torch's,
unlike its Linear) and the same gate order (LSTM: input, forget, cell, output; GRU: reset,
update, candidate): ``harness.testing.check_backend`` and tests/unit/test_sequences.py hold the
fused op equal to :func:`harness.numpy_nets.recurrent_step` and to torch's given the same
weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness import sequences
from harness_paddle.framework import nn, paddle

__all__ = ["Recurrent"]


class Recurrent(nn.Layer):  # type: ignore[misc]
    """See :meth:`harness.api.Backend.recurrent`. Orthogonal weights (gain 1), zero biases."""

    def __init__(self, kind: str, in_dim: int, hidden_dim: int) -> None:
        super().__init__()
        sequences.state_dim(kind, hidden_dim)  # (checks the kind)
        self.kind = kind
        self.hidden_dim = hidden_dim
        weight = paddle.ParamAttr(initializer=nn.initializer.Orthogonal(gain=1.0))
        bias = paddle.ParamAttr(initializer=nn.initializer.Constant(0.0))
        self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(
            in_dim,
            hidden_dim,
            time_major=True,
            weight_ih_attr=weight,
            weight_hh_attr=weight,
            bias_ih_attr=bias,
            bias_hh_attr=bias,
        )
        # paddle registers each weight twice: on the RNN (``weight_ih_l0``, what its fused
        # kernel reads) and on the per-step cell it falls back to (``0.cell.weight_ih``). The
        # cell goes, so the state dict holds each weight once under torch's key; the fused
        # path is then the only one, which the check below makes sure of.
        delattr(self.rnn, "0")
        if not self.rnn.could_use_cudnn or paddle.device.is_compiled_with_rocm():
            raise RuntimeError(
                f"paddle {paddle.__version__} would not run this {kind} layer with its fused "
                f"kernel (ROCm build?); the harness's paddle recurrent layer needs it"
            )

    def _split(self, state: paddle.Tensor) -> Any:
        if self.kind == "gru":
            return state.unsqueeze(0)
        h = self.hidden_dim
        return (state[:, :h].unsqueeze(0), state[:, h:].unsqueeze(0))

    def _join(self, final: Any) -> paddle.Tensor:
        if self.kind == "gru":
            return final[0]
        return paddle.concat([final[0][0], final[1][0]], axis=-1)

    def forward(
        self, x: paddle.Tensor, state: paddle.Tensor, starts: Any = None, final: bool = True
    ) -> tuple[paddle.Tensor, paddle.Tensor | None]:
        steps, width = x.shape[0], x.shape[1]
        x = x.reshape([steps, width, -1])
        plan = None
        if starts is not None:
            flags = starts.numpy() if isinstance(starts, paddle.Tensor) else starts
            flags = np.asarray(flags, bool)
            if flags[0].any():  # episodes that start at the first step start from zeros
                state = state * paddle.to_tensor(~flags[0], dtype=state.dtype)[:, None]
            plan = sequences.plan_segments(flags)
        if plan is None:
            out, last = self._run(x, self._split(state))
            return out, self._join(last) if final else None
        rows = paddle.concat([x.reshape([steps * width, -1]), paddle.zeros_like(x[0, :1])])
        longest, count = plan.gather.shape
        segments = paddle.gather(rows, paddle.to_tensor(plan.gather.reshape(-1)))
        segments = segments.reshape([longest, count, -1])  # (L, N, in)
        keep = paddle.to_tensor(plan.keeps_state, dtype=state.dtype)[:, None]
        initial = paddle.gather(state, paddle.to_tensor(plan.env)) * keep
        # with lengths, paddle's kernel stops each segment at its own last step: outputs past
        # it are zeros (never scattered back) and the final state is the one after that step.
        # Unlike torch's packed path it costs no more than without (L = 60, N = 209, 64
        # units, CPU: forward + backward 137 vs 143 ms), so there is one call, final or not.
        lengths = paddle.to_tensor(plan.lengths.astype(np.int32))
        out, ends = self._run(segments, self._split(initial), lengths)
        out = paddle.gather(out.reshape([-1, self.hidden_dim]), paddle.to_tensor(plan.scatter))
        out = out.reshape([steps, width, self.hidden_dim])
        if not final:
            return out, None
        return out, paddle.gather(self._join(ends), paddle.to_tensor(plan.last))

    def _run(self, x: paddle.Tensor, initial: Any, lengths: Any = None) -> Any:
        """The fused kernel on ``x``. Its backward needs a gradient for every weight: with
        frozen weights (``Backend.frozen``: an actor's loss through a recurrent critic) it
        stopped with "Required tensor shall not be nullptr". Frozen weights then run as
        detached leaves sharing their memory, whose gradients nobody reads."""
        rnn = self.rnn
        weights = rnn._all_weights  # what paddle's fused call reads (nn.RNNBase._cudnn_impl)
        if not any(w.stop_gradient for w in weights):
            return rnn(x, initial, lengths)
        loose = []
        for w in weights:
            if w.stop_gradient:
                w = w.detach()
                w.stop_gradient = False
            loose.append(w)
        rnn._all_weights = loose
        try:
            return rnn(x, initial, lengths)
        finally:
            rnn._all_weights = weights

    def numpy_weights(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(w_ih, b_ih, w_hh, b_hh)`` as :func:`harness.numpy_nets.recurrent_step` takes
        them: float32 copies, weights ``(fan_in, G * H)``."""
        rnn = self.rnn
        return (
            _np32(rnn.weight_ih_l0).T.copy(),
            _np32(rnn.bias_ih_l0),
            _np32(rnn.weight_hh_l0).T.copy(),
            _np32(rnn.bias_hh_l0),
        )


def _np32(t: paddle.Tensor) -> np.ndarray:
    return np.array(t.detach().astype("float32").numpy(), copy=True)
