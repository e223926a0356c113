"""check_backend's part for ``Backend.recurrent``: the fused sequence op against its own
one-step numpy copy (acting and learning must see the same network), with episode starts
wherever a rollout chunk holds them, its gradients against a step-by-step unroll's, ``frozen``,
training and weight round trips, for both kinds."""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.sequences import RECURRENT_KINDS, state_dim
from harness.testing.common import _check, _close, _same, _snapshot


def _np(bk: Any, x: Any) -> np.ndarray:
    return np.asarray(bk.numpy(x))


def _episode_starts(rng: np.random.Generator, steps: int, width: int) -> np.ndarray:
    """``(steps, width)`` start flags with every case a segment plan must get right: a start
    at the first step (env 0), consecutive starts (env 1), a start at the last step (env 2),
    none at all (env 3), and random ones elsewhere."""
    starts = rng.random((steps, width)) < 0.25
    starts[:, :4] = False
    starts[0, 0] = starts[2, 1] = starts[3, 1] = starts[steps - 1, 2] = True
    return starts


def _unrolled(step: Any, x: np.ndarray, state: np.ndarray, starts: Any) -> Any:
    """The recurrent copy ``step`` run one time step at a time, the state zeroed where an
    episode starts: the outputs ``(T, B, H)`` and the final state, numpy."""
    outs = []
    for t in range(len(x)):
        if starts is not None:
            state = state * ~starts[t][:, None]
        out, state = step(x[t], state)
        outs.append(np.asarray(out))
    return np.stack(outs), np.asarray(state)


def _check_recurrent(bk: Any, rng: np.random.Generator, who: str) -> None:
    """recurrent(kind, in, hidden): shapes, the fused op equal to its numpy step copy (acting
    and learning see the same network), gradients, training and weight round trips."""
    steps, width, in_dim, hidden = 6, 7, 3, 5
    x = rng.standard_normal((steps, width, in_dim)).astype(np.float32)
    starts = _episode_starts(rng, steps, width)
    first_only = np.zeros_like(starts)
    first_only[0, ::2] = True  # starts at the first step alone: no segments needed
    for kind in RECURRENT_KINDS:
        what = f"recurrent({kind!r}, {in_dim}, {hidden})"
        layer = bk.recurrent(kind, in_dim, hidden)
        size = state_dim(kind, hidden)
        state = rng.standard_normal((width, size)).astype(np.float32)
        step = bk.inference(layer)
        for name, flags, given in (
            ("starts=None", None, None),
            ("episode starts inside the sequences", starts, starts),
            ("episode starts only at the first step", first_only, first_only),
            ("starts as a tensor", starts, bk.tensor(starts, "bool")),
        ):
            with bk.no_grad():
                out, final = layer(bk.tensor(x), bk.tensor(state), given)
            out, final = _np(bk, out), _np(bk, final)
            _check(
                out.shape == (steps, width, hidden) and final.shape == (width, size),
                who,
                f"{what} on x {x.shape}, state {state.shape} returned shapes {out.shape} and "
                f"{final.shape}, expected {(steps, width, hidden)} and {(width, size)}",
            )
            ref_out, ref_final = _unrolled(step, x, state, flags)
            _close(who, f"{what} outputs vs inference() stepped, {name}", out, ref_out, rtol=1e-4)
            _close(who, f"{what} final state vs inference(), {name}", final, ref_final, rtol=1e-4)
            with bk.no_grad():
                alone, none = layer(bk.tensor(x), bk.tensor(state), given, final=False)
            _check(none is None, who, f"{what}(..., final=False) returned a final state")
            _close(who, f"{what} outputs with final=False, {name}", _np(bk, alone), out)
        _check_recurrent_gradients(bk, kind, hidden, layer, x, state, starts, who)
        _check_recurrent_frozen(bk, what, layer, x, state, starts, who)
        fresh = bk.recurrent(kind, in_dim, hidden)
        weights = bk.get_weights(layer)
        _check(
            not _same(weights, bk.get_weights(fresh)),
            who,
            f"two {what} layers built in a row have identical weights",
        )
        bk.set_weights(fresh, weights)
        with bk.no_grad():
            a = _np(bk, layer(bk.tensor(x), bk.tensor(state), starts)[0])
            b = _np(bk, fresh(bk.tensor(x), bk.tensor(state), starts)[0])
        _close(who, f"{what} after set_weights(get_weights()) of a trained layer", b, a)
        _close(
            who,
            f"inference({what}) taken after set_weights()",
            _unrolled(bk.inference(fresh), x, state, starts)[0],
            a,
            rtol=1e-4,
        )


def _check_recurrent_gradients(
    bk: Any,
    kind: str,
    hidden: int,
    layer: Any,
    x: np.ndarray,
    state: np.ndarray,
    starts: np.ndarray,
    who: str,
) -> None:
    """The fused op's gradient equals a step-by-step unroll's through the same layer (the
    episode segments lose no gradient and gain none), and Adam then moves every weight."""
    what = f"recurrent({kind!r})"
    twin = bk.recurrent(kind, x.shape[-1], hidden)
    bk.set_weights(twin, bk.get_weights(layer))
    goal = np.linspace(-0.5, 0.5, x.shape[0] * x.shape[1] * hidden, dtype=np.float32)
    target = bk.tensor(goal.reshape(x.shape[0], x.shape[1], hidden))

    def loss(out: Any, final: Any) -> Any:
        return bk.mean(bk.mse(out, target)) + bk.mean(final * final)

    def fused() -> Any:
        return loss(*layer(bk.tensor(x), bk.tensor(state), starts))

    def unrolled() -> Any:
        outs, s = [], bk.tensor(state)
        for t in range(len(x)):
            s = s * bk.tensor((~starts[t])[:, None].astype(np.float32))
            out, s = twin(bk.tensor(x[t : t + 1]), s)
            outs.append(out)
        return loss(bk.concat(outs, axis=0), s)

    norms = []
    for model, make_loss in ((layer, fused), (twin, unrolled)):
        before = _snapshot(bk.get_weights(model))
        try:
            norm = bk.update(bk.optimizer(model, lr=1e-2), make_loss())
        except Exception as exc:  # a graph cut in the layer: say so, as a failed check
            raise AssertionError(
                f"{who}: {what}: backpropagating a loss on its outputs failed ({exc!r})"
            ) from exc
        after = bk.get_weights(model)
        still = sorted(k for k in after if np.array_equal(after[k], before[k]))
        _check(not still, who, f"{what}: one Adam step left {still} unchanged (no gradient?)")
        norms.append(norm)
    _close(
        who,
        f"{what}: gradient norm of the fused op with episode starts vs a step-by-step unroll",
        norms[0],
        norms[1],
        rtol=1e-4,
    )


def _check_recurrent_frozen(
    bk: Any, what: str, layer: Any, x: np.ndarray, state: np.ndarray, starts: Any, who: str
) -> None:
    """frozen(layer): a loss through the layer moves what feeds it, not the layer (an actor
    trained through a recurrent critic)."""
    feed = bk.parameter(x.copy())  # (torch's may share the array's memory)
    opt = bk.optimizer(layer, feed, lr=1e-2)
    before = _snapshot(bk.get_weights(layer))
    with bk.frozen(layer):
        out, final = layer(feed, bk.tensor(state), starts)
        loss = bk.mean(out * out) + bk.mean(final * final)
    try:
        bk.update(opt, loss)
    except Exception as exc:
        raise AssertionError(
            f"{who}: frozen({what}): backpropagating a loss through it to its inputs failed "
            f"({exc!r})"
        ) from exc
    _check(
        _same(before, bk.get_weights(layer)),
        who,
        f"frozen({what}): an update through it still changed its weights",
    )
    _check(
        not np.array_equal(_np(bk, feed), x),
        who,
        f"frozen({what}): no gradient reached the inputs that feed it",
    )
