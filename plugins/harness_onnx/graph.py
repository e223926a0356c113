"""A :class:`harness.numpy_nets.PolicyProgram` as an ONNX graph, written node by node with
``onnx.helper``: no framework traces anything, so a torch and a paddle run export alike.

The graph's interface (docs/export.md):

* input ``obs`` float32 ``(batch, obs_dim)``: the env's observations, flattened;
* recurrent policies: input ``state`` float32 ``(batch, state_size)`` (an LSTM's ``h`` then
  ``c``; zeros at an episode's start) and output ``state_out``, the state after this step;
* output ``action``: float32 ``(batch, act_dim)``, the env action ``harness eval`` sends (box),
  or int64 ``(batch,)`` (discrete).

Each program op maps onto a few standard operators (opset 17, IR version 8, which
onnxruntime reads from 1.13 on), in the order the numpy evaluation computes them, so the two
agree to float32 rounding: ``Standardize`` runs in float64 as the agents' running statistics do;
an LSTM or GRU step is spelled out (MatMul, Split, Sigmoid, Tanh) in torch's gate order rather
than through ONNX's ``LSTM`` operator, whose gate order and state layout differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from harness.numpy_nets import (
    Activation,
    Argmax,
    Clip,
    Columns,
    Dense,
    Op,
    PolicyProgram,
    Recurrent,
    Rescale,
    Standardize,
)

OPSET = 17
"""The ONNX operator set the graph uses (every operator here exists unchanged since 13)."""
IR_VERSION = 8
"""The IR version of opset 17: what onnxruntime 1.13 and later read (onnx 1.23 writes 10 by
default, which runtimes older than 1.20 refuse)."""
ACTIVATION_OPS: dict[str, tuple[str, dict[str, Any]]] = {
    "tanh": ("Tanh", {}),
    "relu": ("Relu", {}),
    "elu": ("Elu", {"alpha": 1.0}),
}
"""numpy_nets' activation names as ONNX operators."""


class GraphBuilder:
    """Nodes and initializers under generated unique names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, hint: str, value: Any, dtype: Any = np.float32) -> str:
        """An initializer holding ``value`` as ``dtype``; returns its name."""
        name = self.name(hint)
        array = np.ascontiguousarray(np.asarray(value, dtype))
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs: Any) -> Any:
        """One node; returns its output name (a list of names for ``outputs > 1``)."""
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names

    def columns(self, x: str, start: int, stop: int) -> str:
        """``x[:, start:stop]``."""
        return str(
            self.op(
                "Slice",
                x,
                self.const("starts", [start], np.int64),
                self.const("ends", [stop], np.int64),
                self.const("axes", [1], np.int64),
            )
        )


def emit(g: GraphBuilder, op: Op, h: str, state: str | None) -> tuple[str, str | None]:
    """The nodes of one program op on features ``h`` (and the recurrent ``state``); returns
    the features and the state after it."""
    if isinstance(op, Dense):
        return g.op("Add", g.op("MatMul", h, g.const("w", op.w)), g.const("b", op.b)), state
    if isinstance(op, Activation):
        op_type, attrs = ACTIVATION_OPS[op.name]
        return g.op(op_type, h, **attrs), state
    if isinstance(op, Standardize):
        x = g.op("Cast", h, to=TensorProto.DOUBLE)
        z = g.op(
            "Div",
            g.op("Sub", x, g.const("mean", op.mean, np.float64)),
            g.const("std", op.std, np.float64),
        )
        lo, hi = g.const("lo", -op.clip, np.float64), g.const("hi", op.clip, np.float64)
        return g.op("Cast", g.op("Clip", z, lo, hi), to=TensorProto.FLOAT), state
    if isinstance(op, Columns):
        return g.columns(h, op.start, op.stop), state
    if isinstance(op, Clip):  # per-dimension bounds: ONNX Clip takes scalars only
        return g.op("Min", g.op("Max", h, g.const("low", op.low)), g.const("high", op.high)), state
    if isinstance(op, Rescale):
        return g.op(
            "Add", g.const("centre", op.centre), g.op("Mul", g.const("half", op.half), h)
        ), state
    if isinstance(op, Argmax):
        return g.op("ArgMax", h, axis=1, keepdims=0, select_last_index=0), state
    if isinstance(op, Recurrent):
        if state is None:
            raise ValueError("a Recurrent op needs the graph's state input")
        return lstm(g, op, h, state) if op.kind == "lstm" else gru(g, op, h, state)
    raise TypeError(f"no ONNX spelling for policy-program op {type(op).__name__}")


def lstm(g: GraphBuilder, cell: Recurrent, x: str, state: str) -> tuple[str, str]:
    """One LSTM step as numpy_nets computes it: gates ``x Wi + bi + h Wh + bh`` in torch's
    order (input, forget, cell, output); state ``[h, c]``."""
    size = cell.hidden
    h, c = g.columns(state, 0, size), g.columns(state, size, 2 * size)
    gates = g.op("Add", g.op("MatMul", x, g.const("w_ih", cell.w_ih)), g.const("b_ih", cell.b_ih))
    gates = g.op("Add", gates, g.op("MatMul", h, g.const("w_hh", cell.w_hh)))
    gates = g.op("Add", gates, g.const("b_hh", cell.b_hh))
    i, f, cand, o = g.op("Split", gates, g.const("split", [size] * 4, np.int64), outputs=4, axis=1)
    keep = g.op("Mul", g.op("Sigmoid", f), c)
    c_next = g.op("Add", keep, g.op("Mul", g.op("Sigmoid", i), g.op("Tanh", cand)))
    h_next = g.op("Mul", g.op("Sigmoid", o), g.op("Tanh", c_next))
    return h_next, g.op("Concat", h_next, c_next, axis=1)


def gru(g: GraphBuilder, cell: Recurrent, x: str, h: str) -> tuple[str, str]:
    """One GRU step as numpy_nets computes it (torch's ``GRUCell``: reset, update,
    candidate); the state is the output."""
    size = cell.hidden
    split = g.const("split", [size] * 3, np.int64)
    gi = g.op("Add", g.op("MatMul", x, g.const("w_ih", cell.w_ih)), g.const("b_ih", cell.b_ih))
    gh = g.op("Add", g.op("MatMul", h, g.const("w_hh", cell.w_hh)), g.const("b_hh", cell.b_hh))
    i_r, i_z, i_n = g.op("Split", gi, split, outputs=3, axis=1)
    h_r, h_z, h_n = g.op("Split", gh, split, outputs=3, axis=1)
    r = g.op("Sigmoid", g.op("Add", i_r, h_r))
    z = g.op("Sigmoid", g.op("Add", i_z, h_z))
    n = g.op("Tanh", g.op("Add", i_n, g.op("Mul", r, h_n)))
    one_minus_z = g.op("Sub", g.const("one", 1.0), z)
    h_next = g.op("Add", g.op("Mul", one_minus_z, n), g.op("Mul", z, h))
    return h_next, h_next


def build_model(
    program: PolicyProgram, metadata: Mapping[str, str], *, doc: str = ""
) -> onnx.ModelProto:
    """The ONNX model of ``program`` (checked with ``onnx.checker``, full check), with
    ``metadata`` as its ``metadata_props``."""
    g = GraphBuilder()
    batch = "batch"
    inputs = [
        helper.make_tensor_value_info(
            "obs", TensorProto.FLOAT, [batch, program.obs_dim], "env observations, flattened"
        )
    ]
    state: str | None = None
    if program.state_size:
        state = "state"
        inputs.append(
            helper.make_tensor_value_info(
                "state",
                TensorProto.FLOAT,
                [batch, program.state_size],
                "recurrent state before this step (zeros at an episode's start)",
            )
        )
    h = "obs"
    for op in program.ops:
        h, state = emit(g, op, h, state)
    g.nodes.append(helper.make_node("Identity", [h], ["actions"]))
    if program.discrete:
        action = helper.make_tensor_value_info(
            "actions", TensorProto.INT64, [batch], "discrete actions"
        )
    else:
        action = helper.make_tensor_value_info(
            "actions", TensorProto.FLOAT, [batch, program.act_dim], "env actions (within the box)"
        )
    outputs = [action]
    if program.state_size:
        assert state is not None
        g.nodes.append(helper.make_node("Identity", [state], ["state_out"]))
        outputs.append(
            helper.make_tensor_value_info(
                "state_out", TensorProto.FLOAT, [batch, program.state_size], "state after it"
            )
        )
    graph = helper.make_graph(g.nodes, "harness_policy", inputs, outputs, g.initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="harness",
        producer_version=metadata.get("harness_version", ""),
        doc_string=doc,
    )
    helper.set_model_props(model, dict(metadata))
    onnx.checker.check_model(model, full_check=True)
    return model
