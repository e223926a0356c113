"""harness.sequences: the segment plan against a brute-force reference, the state layout, and
the two backends' fused sequence ops equal to each other given the same weights (values and
gradients), episode starts inside the sequences included."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from harness import numpy_nets
from harness.plugins import collect_registry, make_plugin_manager
from harness.pytest_plugin import cpu_backend
from harness.sequences import RECURRENT_KINDS, plan_segments, state_dim

# ------------------------------------------------------------------------------------------
# the segment plan


def brute_force_segments(starts: np.ndarray) -> list[tuple[int, int, int]]:
    """``(env, first step, length)`` of every run of steps without a reset, env by env."""
    steps, width = starts.shape
    out = []
    for env in range(width):
        first = 0
        for t in range(1, steps):
            if starts[t, env]:
                out.append((env, first, t - first))
                first = t
        out.append((env, first, steps - first))
    return out


def running_sum(x: np.ndarray, state: np.ndarray, starts: np.ndarray) -> Any:
    """A toy recurrence (``state += x``, output the state) stepped with resets: the
    reference the plan's segments must reproduce."""
    outs = []
    for t in range(len(x)):
        state = state * ~starts[t][:, None] + x[t]
        outs.append(state)
    return np.stack(outs), state


def running_sum_by_plan(x: np.ndarray, state: np.ndarray, starts: np.ndarray) -> Any:
    """The same recurrence run the way the backends use a plan: rows gathered into padded
    segments run side by side from their initial states, outputs scattered back, each env's
    final state read at its last segment's own last step."""
    plan = plan_segments(starts)
    assert plan is not None
    steps, width = starts.shape
    rows = np.concatenate([x.reshape(steps * width, -1), np.zeros((1, x.shape[-1]))])
    segments = rows[plan.gather]  # (L, N, features)
    initial = state[plan.env] * plan.keeps_state[:, None]
    outs = initial[None] + np.cumsum(segments, axis=0)
    finals = outs[plan.lengths - 1, np.arange(len(plan.lengths))]
    out = outs.reshape(-1, x.shape[-1])[plan.scatter].reshape(steps, width, -1)
    return out, finals[plan.last]


def random_starts(rng: np.random.Generator, steps: int, width: int, p: float) -> np.ndarray:
    return rng.random((steps, width)) < p


def flags(steps: int, width: int, *at: tuple[int, int]) -> np.ndarray:
    """``(steps, width)`` start flags set at the ``(t, env)`` pairs ``at``."""
    out = np.zeros((steps, width), bool)
    for t, env in at:
        out[t, env] = True
    return out


CASES: dict[str, Callable[[np.random.Generator], np.ndarray]] = {
    "random": lambda rng: random_starts(rng, 9, 6, 0.3),
    "one env": lambda rng: random_starts(rng, 12, 1, 0.3) | (np.arange(12) == 5)[:, None],
    "every step": lambda rng: np.ones((5, 3), bool),
    "first step and last step": lambda rng: flags(4, 3, (0, 0), (3, 1), (0, 2), (3, 2)),
    "consecutive": lambda rng: flags(8, 2, (2, 0), (3, 0), (4, 0), (1, 1), (2, 1)),
}


@pytest.mark.parametrize("case", CASES)
def test_plan_matches_brute_force(case: str) -> None:
    rng = np.random.default_rng(len(case))
    starts = CASES[case](rng)
    steps, width = starts.shape
    plan = plan_segments(starts)
    assert plan is not None
    segments = [
        (int(e), int(plan.gather[0, n]) // width, int(plan.lengths[n]))
        for n, e in enumerate(plan.env)
    ]
    assert segments == brute_force_segments(starts)
    longest, count = plan.gather.shape
    assert longest == plan.lengths.max() and count == len(segments)
    for n, (env, first, length) in enumerate(segments):
        rows = [(first + k) * width + env for k in range(length)]
        assert plan.gather[:length, n].tolist() == rows
        assert (plan.gather[length:, n] == steps * width).all()  # the padding row
        assert plan.keeps_state[n] == (first == 0 and not starts[0, env])
    flat = np.arange(longest * count).reshape(longest, count)
    valid = np.arange(longest)[:, None] < plan.lengths[None]
    assert np.array_equal(np.sort(plan.scatter), np.sort(flat[valid]))
    assert np.array_equal(plan.gather.reshape(-1)[plan.scatter], np.arange(steps * width))
    assert [segments[n][0] for n in plan.last] == list(range(width))
    x = rng.standard_normal((steps, width, 2))
    state = rng.standard_normal((width, 2))
    for got, expected in zip(
        running_sum_by_plan(x, state, starts), running_sum(x, state, starts), strict=True
    ):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "starts",
    [np.zeros((6, 3), bool), np.ones((1, 4), bool), flags(5, 2, (0, 0), (0, 1))],
    ids=["no starts", "one step", "starts only at the first step"],
)
def test_no_plan_when_no_episode_starts_after_the_first_step(starts: np.ndarray) -> None:
    assert plan_segments(starts) is None


def test_plan_needs_time_and_batch_axes() -> None:
    with pytest.raises(ValueError, match=r"starts must be \(T, B\), got shape \(5,\)"):
        plan_segments(np.zeros(5, bool))


def test_state_dim() -> None:
    assert state_dim("lstm", 8) == 16
    assert state_dim("gru", 8) == 8
    with pytest.raises(ValueError, match="recurrent kind 'rnn': expected one of lstm, gru"):
        state_dim("rnn", 8)


def test_recurrent_step_refuses_an_unknown_kind() -> None:
    w = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="recurrent kind 'rnn'"):
        numpy_nets.recurrent_step("rnn", w, w[0], w, w[0])


# ------------------------------------------------------------------------------------------
# torch and paddle: the same weights, the same sequences, the same numbers


@pytest.fixture(scope="module")
def backends() -> tuple[Any, Any]:
    pytest.importorskip("torch", reason="torch is not installed (pip install 'harness[torch]')")
    pytest.importorskip("paddle", reason="paddle is not installed (pip install 'harness[paddle]')")
    registry = collect_registry(make_plugin_manager())
    return cpu_backend(registry, "torch"), cpu_backend(registry, "paddle")


def gradients(bk: Any, layer: Any) -> dict[str, np.ndarray]:
    """Each weight's gradient by its state-dict key (both frameworks keep ``.grad``)."""
    return {k: bk.numpy(p.grad) for k, p in layer.named_parameters()}


@pytest.mark.parametrize("kind", RECURRENT_KINDS)
def test_torch_and_paddle_fused_ops_agree(backends: tuple[Any, Any], kind: str) -> None:
    """Weights copied across as numpy (same keys and shapes, nothing transposed): outputs,
    final states and every weight's gradient of the same loss agree within 1e-5."""
    torch_bk, paddle_bk = backends
    rng = np.random.default_rng(11)
    steps, width, in_dim, hidden = 8, 5, 4, 6
    x = rng.standard_normal((steps, width, in_dim)).astype(np.float32)
    state = rng.standard_normal((width, state_dim(kind, hidden))).astype(np.float32)
    starts = random_starts(rng, steps, width, 0.25)
    starts[0, 0] = starts[3, 1] = starts[4, 1] = True  # a first-step and consecutive starts
    target = rng.standard_normal((steps, width, hidden)).astype(np.float32)
    source = torch_bk.recurrent(kind, in_dim, hidden)
    weights = torch_bk.get_weights(source)
    for given in (None, starts):
        results = []
        for bk in backends:
            layer = bk.recurrent(kind, in_dim, hidden)
            bk.set_weights(layer, weights)
            out, final = layer(bk.tensor(x), bk.tensor(state), given)
            loss = bk.mean(bk.mse(out, bk.tensor(target))) + bk.mean(final * final)
            loss.backward()
            results.append((bk.numpy(out), bk.numpy(final), gradients(bk, layer)))
        (t_out, t_final, t_grads), (p_out, p_final, p_grads) = results
        np.testing.assert_allclose(p_out, t_out, rtol=0, atol=1e-5)
        np.testing.assert_allclose(p_final, t_final, rtol=0, atol=1e-5)
        assert set(p_grads) == set(t_grads) == set(weights)
        for key, grad in t_grads.items():
            assert np.abs(grad).max() > 1e-3, f"{key}: no gradient, the comparison is empty"
            np.testing.assert_allclose(p_grads[key], grad, rtol=0, atol=1e-5, err_msg=key)
    step = numpy_nets.recurrent_step(
        kind,
        weights["rnn.weight_ih_l0"].T,
        weights["rnn.bias_ih_l0"],
        weights["rnn.weight_hh_l0"].T,
        weights["rnn.bias_hh_l0"],
    )
    copy = paddle_bk.recurrent(kind, in_dim, hidden)
    paddle_bk.set_weights(copy, weights)
    for bk, layer in ((torch_bk, source), (paddle_bk, copy)):  # both copies are numpy_nets'
        got, expected = bk.inference(layer)(x[0], state), step(x[0], state)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
