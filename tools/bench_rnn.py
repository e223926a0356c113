"""The fused recurrent op (``Backend.recurrent``) vs a step-by-step unroll of the same weights:
forward + backward time of one sequence batch, per backend and case.

* **fused**: the backend's recurrent layer, built through the plugin registry as a run builds
  it, called once on the whole time-major batch (torch ``nn.GRU`` / ``nn.LSTM``, paddle's
  ``rnn`` kernel; episode starts inside the sequences run as packed segments,
  ``harness.sequences.plan_segments``).
* **unroll**: a Python loop over time calling the framework's own cell (torch ``nn.GRUCell`` /
  ``nn.LSTMCell``, paddle ``nn.GRUCell`` / ``nn.LSTMCell``) loaded with the fused layer's
  weights, the state multiplied by the keep mask before a step where an episode starts: what
  QMIX's agent did before issue 28 (one cell call per step).

Both compute the same thing: before timing, the script asserts that their outputs, final
states and gradients (of the input, the initial state and every weight) agree. One timed
iteration is the forward pass from a non-zero initial state and the gradients of ``sum(out *
g)`` for a fixed random ``g`` (``autograd.grad``, so nothing accumulates). Each side warms up,
then the two take turns (ABBA order, so a drift of the machine's speed cancels to first order)
for ``--repeats`` iterations each; the table gives each side's median and the median of the
per-pair ratios unroll / fused. Target (issue 28): fused >= 5x faster on a QMIX-sized batch.

Cases: QMIX's agent network on simple_spread-like batches (sequences of ``seq_len`` 32 steps
plus the bootstrap step, 32 sequences x 3 agents = 96 rows, the GRU fed the 64-unit ReLU
layer's output, 64 units), as a GRU (QMIX's) and an LSTM; and recurrent PPO's rollout on masked
CartPole (8 envs x 32 steps, 2 observation entries in, 64 units) with episode starts inside
the chunk (about one every 20 steps, CartPole's early episodes), GRU and LSTM, and the same
chunk without starts (the difference is what running packed segments costs).

    .venv/bin/python tools/bench_rnn.py                   # torch and paddle, CPU, 1 thread
    .venv/bin/python tools/bench_rnn.py --quick           # smoke run (a few repeats)
    .venv/bin/python tools/bench_rnn.py --device cuda     # on the GPU (synchronised timing)
    .venv/bin/python tools/bench_rnn.py --backends torch --threads 2

A backend that is not installed, or has no ``recurrent`` layer, is skipped with a note.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from benchlib import cpus_and_model

from harness.plugins import collect_registry, make_plugin_manager


@dataclass(frozen=True)
class Case:
    """One sequence batch shape."""

    name: str
    kind: str
    steps: int
    rows: int
    in_dim: int
    hidden: int
    starts: bool
    """Episode starts inside the sequences (the fused op runs packed segments)."""


CASES = (
    Case("QMIX agent, L=32+1, 32 seq x 3 agents", "gru", 33, 96, 64, 64, False),
    Case("QMIX agent, L=32+1, 32 seq x 3 agents", "lstm", 33, 96, 64, 64, False),
    Case("PPO masked CartPole, T=32, 8 envs, starts", "gru", 32, 8, 2, 64, True),
    Case("PPO masked CartPole, T=32, 8 envs, starts", "lstm", 32, 8, 2, 64, True),
    # the same chunk without starts: what the packed segments cost
    Case("PPO masked CartPole, T=32, 8 envs, no starts", "gru", 32, 8, 2, 64, False),
    Case("PPO masked CartPole, T=32, 8 envs, no starts", "lstm", 32, 8, 2, 64, False),
)
WEIGHTS = ("rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_ih_l0", "rnn.bias_hh_l0")
"""The recurrent layer's parameters as both backends name them (torch's layout)."""


def episode_starts(case: Case, rng: np.random.Generator) -> np.ndarray | None:
    """``(T, B)`` start flags, about one episode start every 20 steps (None: no starts)."""
    if not case.starts:
        return None
    flags = rng.random((case.steps, case.rows)) < 1.0 / 20.0
    flags[rng.integers(1, case.steps), 0] = True  # at least one start inside a sequence
    return flags


# --- the frameworks' own cells and autograd ------------------------------------------------


class Framework:
    """What the unroll and the timing need from a framework (torch or paddle)."""

    def __init__(self, name: str, backend: Any, device: str) -> None:
        self.name = name
        self.backend = backend
        self.device = device

    def tensor(self, x: np.ndarray, grad: bool = False) -> Any:
        t = self.backend.tensor(x)
        if grad:
            t = _requires_grad(self.name, t)
        return t

    def cell(self, kind: str, weights: dict[str, np.ndarray]) -> Any:
        """The framework's own LSTM/GRU cell holding ``weights`` (torch's layout and gate
        order, which paddle's cells share)."""
        w_ih = weights["rnn.weight_ih_l0"]
        in_dim, hidden = w_ih.shape[1], weights["rnn.weight_hh_l0"].shape[1]
        if self.name == "torch":
            import torch
            from torch import nn

            cell = (nn.LSTMCell if kind == "lstm" else nn.GRUCell)(in_dim, hidden)
            with torch.no_grad():
                for key, param in zip(WEIGHTS, _cell_params(cell), strict=True):
                    param.copy_(torch.as_tensor(weights[key]))
            return cell.to(self.device)
        from paddle import nn as pnn

        cell = (pnn.LSTMCell if kind == "lstm" else pnn.GRUCell)(in_dim, hidden)
        for key, param in zip(WEIGHTS, _cell_params(cell), strict=True):
            param.set_value(weights[key])
        return cell

    def grad(self, loss: Any, inputs: list[Any]) -> list[Any]:
        if self.name == "torch":
            import torch

            return list(torch.autograd.grad(loss, inputs))
        import paddle

        return list(paddle.grad(loss, inputs))

    def sync(self) -> None:
        if self.device == "cpu":
            return
        if self.name == "torch":
            import torch

            torch.cuda.synchronize()
        else:
            import paddle

            paddle.device.synchronize()


def _requires_grad(name: str, t: Any) -> Any:
    if name == "torch":
        return t.requires_grad_()
    t.stop_gradient = False
    return t


def _cell_params(cell: Any) -> list[Any]:
    """A cell's parameters in the order of :data:`WEIGHTS`."""
    return [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]


def unroll(fw: Framework, kind: str, cell: Any, x: Any, state: Any, keep: Any) -> Any:
    """Outputs ``(T, B, H)`` and the final state of a loop over time calling ``cell``; ``keep``
    ``(T, B, 1)`` zeroes the state before a step where an episode starts (None: no starts)."""
    hidden = state.shape[1] // 2 if kind == "lstm" else state.shape[1]
    h, c = (state[:, :hidden], state[:, hidden:]) if kind == "lstm" else (state, None)
    outs = []
    for t in range(x.shape[0]):
        if keep is not None:
            h = h * keep[t]
            c = c * keep[t] if c is not None else None
        if kind == "lstm":
            if fw.name == "torch":
                h, c = cell(x[t], (h, c))
            else:
                h, (h, c) = cell(x[t], (h, c))
        else:
            h = cell(x[t], h) if fw.name == "torch" else cell(x[t], h)[0]
        outs.append(h)
    final = h if c is None else _concat(fw, [h, c], axis=1)
    return _stack(fw, outs), final


def _stack(fw: Framework, parts: list[Any]) -> Any:
    if fw.name == "torch":
        import torch

        return torch.stack(parts)
    import paddle

    return paddle.stack(parts)


def _concat(fw: Framework, parts: list[Any], axis: int) -> Any:
    return fw.backend.concat(parts, axis=axis)


# --- one case -------------------------------------------------------------------------------


def measure(fw: Framework, case: Case, repeats: int, warmup: int) -> dict[str, float]:
    """Check the fused layer against the unroll, then time both (seconds per iteration)."""
    rng = np.random.default_rng(0)
    bk = fw.backend
    layer = bk.recurrent(case.kind, case.in_dim, case.hidden)
    # non-zero biases, so a bias in the wrong gate would show in the check
    weights = {
        k: rng.normal(0.0, 0.2, v.shape).astype(np.float32)
        for k, v in bk.get_weights(layer).items()
    }
    bk.set_weights(layer, weights)
    cell = fw.cell(case.kind, weights)
    width = 2 * case.hidden if case.kind == "lstm" else case.hidden
    x_np = rng.standard_normal((case.steps, case.rows, case.in_dim)).astype(np.float32)
    state_np = rng.normal(0.0, 0.5, (case.rows, width)).astype(np.float32)
    g = fw.tensor(rng.standard_normal((case.steps, case.rows, case.hidden)).astype(np.float32))
    starts = episode_starts(case, rng)
    keep = None if starts is None else fw.tensor((~starts).astype(np.float32)[..., None])
    x, state = fw.tensor(x_np, grad=True), fw.tensor(state_np, grad=True)
    fused_params = [p for _, p in sorted(_named(layer), key=lambda kv: WEIGHTS.index(kv[0]))]

    def fused() -> tuple[Any, Any, list[Any]]:
        out, final = layer(x, state, starts)
        return out, final, fw.grad(bk.sum(out * g), [x, state, *fused_params])

    def stepped() -> tuple[Any, Any, list[Any]]:
        out, final = unroll(fw, case.kind, cell, x, state, keep)
        return out, final, fw.grad(bk.sum(out * g), [x, state, *_cell_params(cell)])

    a, b = fused(), stepped()
    for name, u, v in zip(
        ("outputs", "final state", "d input", "d state", *WEIGHTS),
        (a[0], a[1], *a[2]),
        (b[0], b[1], *b[2]),
        strict=True,
    ):
        np.testing.assert_allclose(bk.numpy(u), bk.numpy(v), rtol=2e-3, atol=2e-4, err_msg=name)
    times: dict[str, list[float]] = {"fused": [], "unroll": []}
    sides: dict[str, Callable[[], Any]] = {"fused": fused, "unroll": stepped}
    for fn in (fused, stepped):
        for _ in range(warmup):
            fn()
    fw.sync()
    for i in range(repeats):
        order = ("fused", "unroll") if i % 2 == 0 else ("unroll", "fused")
        for side in order:
            start = time.perf_counter()
            sides[side]()
            fw.sync()
            times[side].append(time.perf_counter() - start)
    ratios = [u / f for u, f in zip(times["unroll"], times["fused"], strict=True)]
    return {
        "fused": statistics.median(times["fused"]),
        "unroll": statistics.median(times["unroll"]),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def _named(layer: Any) -> list[tuple[str, Any]]:
    return [(k, p) for k, p in layer.named_parameters() if k in WEIGHTS]


def make_framework(name: str, device: str, threads: int) -> Framework | str:
    """The backend ``name`` on ``device`` wrapped for the benchmark, or why it is skipped."""
    registry = collect_registry(make_plugin_manager())
    if device in ("cuda", "gpu"):  # each framework's name for its GPU
        device = "gpu" if name == "paddle" else "cuda"
    try:
        spec = registry.backends.get(name)
        options = spec.config_cls(device=device, threads=threads) if spec.config_cls else None
        backend = spec.load(options)
    except Exception as exc:  # not installed, no such device: a note under the table
        return f"{name}: skipped ({type(exc).__name__}: {exc})"
    if not hasattr(backend, "recurrent"):
        return f"{name}: skipped (the backend has no recurrent layer)"
    backend.seed(0)
    return Framework(name, backend, device)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="torch,paddle", help="comma-separated backend names")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, gpu, ...")
    p.add_argument("--threads", type=int, default=1, help="intra-op CPU threads (default 1)")
    p.add_argument("--repeats", type=int, default=40, help="timed iterations per side")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per side first")
    p.add_argument("--quick", action="store_true", help="smoke run: 6 repeats, 2 warm-ups")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.warmup = 6, 2
    command = "python tools/bench_rnn.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        f"Fused recurrent op vs step-by-step unroll, forward + backward ({cpus_and_model()}, "
        f"device {args.device}, {args.threads} thread(s), median of {args.repeats}):",
        "",
        "| backend | case | kind | fused ms | unroll ms | unroll / fused (min-max) |",
        "|---|---|---|---:|---:|---:|",
    ]
    notes = []
    for name in args.backends.split(","):
        fw = make_framework(name.strip(), args.device, args.threads)
        if isinstance(fw, str):
            notes.append(fw)
            continue
        for case in CASES:
            r = measure(fw, case, args.repeats, args.warmup)
            lines.append(
                f"| {fw.name} | {case.name} | {case.kind} | {r['fused'] * 1e3:.2f} | "
                f"{r['unroll'] * 1e3:.2f} | {r['ratio']:.2f}x ({r['ratio_min']:.2f}-"
                f"{r['ratio_max']:.2f}) |"
            )
    lines += ["", *notes, f"Command: `{command.strip()}`"]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
