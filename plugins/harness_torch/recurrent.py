"""The torch backend's recurrent layer (:meth:`harness.api.Backend.recurrent`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from harness import sequences

__all__ = ["Recurrent"]


class Recurrent(nn.Module):
    """See :meth:`harness.api.Backend.recurrent`: torch's fused ``nn.LSTM`` / ``nn.GRU``
    (one layer, time-major) with the state as one ``(B, S)`` tensor, and episode starts
    inside the sequences run as packed segments (:func:`harness.sequences.plan_segments`)."""

    def __init__(self, kind: str, in_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.kind = kind
        self.hidden_dim = hidden_dim
        self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(in_dim, hidden_dim)
        for name, param in self.rnn.named_parameters():
            if name.startswith("weight"):
                nn.init.orthogonal_(param, 1.0)
            else:
                nn.init.zeros_(param)

    def _split(self, state: torch.Tensor) -> Any:
        if self.kind == "gru":
            return state[None].contiguous()
        h = self.hidden_dim
        return (state[None, :, :h].contiguous(), state[None, :, h:].contiguous())

    def _join(self, final: Any) -> torch.Tensor:
        if self.kind == "gru":
            return final[0]  # type: ignore[no-any-return]
        return torch.cat([final[0][0], final[1][0]], dim=-1)

    def forward(
        self, x: torch.Tensor, state: torch.Tensor, starts: Any = None, final: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        steps, width = x.shape[0], x.shape[1]
        x = x.reshape(steps, width, -1)
        flags = None
        if starts is not None:
            flags = starts.detach().cpu().numpy() if isinstance(starts, torch.Tensor) else starts
            flags = np.asarray(flags, bool)
            if flags[0].any():  # episodes that start at the first step start from zeros
                keep = torch.as_tensor(~flags[0], dtype=state.dtype, device=state.device)
                state = state * keep[:, None]
        plan = None if flags is None else sequences.plan_segments(flags)
        if plan is None:
            out, last = self.rnn(x, self._split(state))
            return out, self._join(last) if final else None
        # the segments side by side, padded at the end, in one call: packing them instead
        # (pack_padded_sequence) keeps torch's CPU LSTM off oneDNN's fused kernels, forward +
        # backward 7.3 vs 1.5 ms at T = 32, 16 segments, 64 units (docs/benchmarks.md)
        device = x.device
        rows = torch.cat([x.reshape(steps * width, -1), x.new_zeros(1, x.shape[-1])])
        segments = rows[torch.as_tensor(plan.gather, device=device)]  # (L, N, in)
        keep = torch.as_tensor(plan.keeps_state, dtype=state.dtype, device=device)
        initial = state[torch.as_tensor(plan.env, device=device)] * keep[:, None]
        out, ends = self.rnn(segments, self._split(initial))
        out = out.reshape(-1, self.hidden_dim)[torch.as_tensor(plan.scatter, device=device)]
        out = out.reshape(steps, width, self.hidden_dim)
        if not final:
            return out, None
        # an env's last segment shorter than the longest ran on into padding: its final
        # state comes from a packed pass over those segments alone
        last = self._join(ends)[torch.as_tensor(plan.last, device=device)]
        short = np.flatnonzero(plan.lengths[plan.last] < segments.shape[0])
        if len(short):
            picked = torch.as_tensor(plan.last[short], device=device)
            packed = nn.utils.rnn.pack_padded_sequence(
                segments[:, picked],
                torch.as_tensor(plan.lengths[plan.last[short]]),
                enforce_sorted=False,
            )
            _, ends = self.rnn(packed, self._split(initial[picked]))
            last = last.index_put((torch.as_tensor(short, device=device),), self._join(ends))
        return out, last
