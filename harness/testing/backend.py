"""check_backend: every method of the Backend protocol against numpy references."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import Distribution
from harness.testing.common import _check, _close, _same, _snapshot
from harness.testing.recurrent import _check_recurrent


def check_backend(backend: Any) -> None:
    """Check every method of :class:`harness.api.Backend` numerically against numpy.

    Covers models (``mlp`` shapes, flattening, activations, ``activate_output``, ``out_gain``,
    ``group``), tensors and arithmetic, ``gather``/``clip``/``minimum``/``maximum``/``exp``,
    reductions with an axis, elementwise ``mse``/``smooth_l1``, categorical and normal
    distributions, optimisers (a regression loss goes down, ``update`` returns the pre-clip
    norm, ``set_lr``), ``copy_weights`` (hard and Polyak), weights and state round trips,
    ``save``/``load`` through a temporary directory, and seeding/RNG-state reproducibility.
    The ``cnn`` trunk too: output shape, uint8 frames, input scaling, training steps. And the
    ``recurrent`` sequence op, both kinds: the fused op against its own one-step numpy copy
    with episode starts anywhere (first step, consecutive steps, last step, none) and with
    ``final=False`` (the outputs alone), gradients equal to those of a step-by-step unroll,
    training, ``frozen`` and weight round trips.
    Reseeds the backend's global RNG as a side effect.
    """
    name = getattr(backend, "name", None)
    who = f"backend {name!r}"
    _check(isinstance(name, str) and bool(name), who, "needs a non-empty str attribute .name")
    _check(isinstance(getattr(backend, "device", None), str), who, "needs a str .device")
    rng = np.random.default_rng(0)
    backend.seed(0)
    for part in (
        _check_tensors,
        _check_ops,
        _check_losses,
        _check_models,
        _check_recurrent,
        _check_distributions,
        _check_training,
        _check_frozen,
        _check_weight_copies,
        _check_state,
        _check_rng,
    ):
        part(backend, rng, who)


def _np(bk: Any, x: Any) -> np.ndarray:
    return np.asarray(bk.numpy(x))


def _check_tensors(bk: Any, rng: np.random.Generator, who: str) -> None:
    x = rng.standard_normal((3, 4)).astype(np.float32)
    back = bk.numpy(bk.tensor(x))
    _check(isinstance(back, np.ndarray), who, f"numpy() returned {type(back).__name__}")
    _check(back.dtype == np.float32, who, f"tensor(float32).numpy() has dtype {back.dtype}")
    _close(who, "tensor/numpy round trip", back, x, rtol=0, atol=0)
    idx = np.array([2, 0, 1], np.int64)
    back_i = _np(bk, bk.tensor(idx, "int64"))
    _check(back_i.dtype == np.int64, who, f"tensor(x, 'int64') round trip gave {back_i.dtype}")
    _check(np.array_equal(back_i, idx), who, "tensor(x, 'int64') round trip changed the values")
    flags = _np(bk, bk.tensor(np.array([True, False, True])))
    _close(who, "tensor(bool array) as float32", flags, [1.0, 0.0, 1.0], atol=0)
    scalar = bk.tensor(2.5)
    _close(who, "tensor(2.5)", _np(bk, scalar), np.float32(2.5), atol=0)
    item = bk.item(scalar)
    _check(isinstance(item, float) and item == 2.5, who, f"item(tensor(2.5)) returned {item!r}")
    a, b = bk.tensor(x), bk.tensor(x[::-1].copy())
    _close(who, "a * b + 1 - a / 2", _np(bk, a * b + 1.0 - a / 2.0), x * x[::-1] + 1 - x / 2)
    _close(who, "1 - 2 * a", _np(bk, 1.0 - 2.0 * a), 1 - 2 * x)
    _close(who, "-a", _np(bk, -a), -x)
    _close(who, "a[:, 0]", _np(bk, a[:, 0]), x[:, 0])
    _close(who, "a[:, None]", _np(bk, a[:, None]), x[:, None])
    with bk.no_grad():
        _close(who, "arithmetic inside no_grad()", _np(bk, a + b), x + x[::-1])


def _check_ops(bk: Any, rng: np.random.Generator, who: str) -> None:
    x = rng.standard_normal((4, 3)).astype(np.float32)
    y = rng.standard_normal((4, 3)).astype(np.float32)
    tx, ty = bk.tensor(x), bk.tensor(y)
    idx = np.array([2, 0, 1, 2], np.int64)
    _close(
        who, "gather(x, index)", _np(bk, bk.gather(tx, bk.tensor(idx, "int64"))), x[range(4), idx]
    )
    x3 = rng.standard_normal((2, 4, 3)).astype(np.float32)  # (batch, agents, actions): QMIX
    idx3 = np.array([[2, 0, 1, 2], [1, 1, 0, 2]], np.int64)
    _close(
        who,
        "gather(x, index) with two leading axes",
        _np(bk, bk.gather(bk.tensor(x3), bk.tensor(idx3, "int64"))),
        np.take_along_axis(x3, idx3[..., None], -1)[..., 0],
    )
    _close(who, "clip(x, -0.5, 0.3)", _np(bk, bk.clip(tx, -0.5, 0.3)), np.clip(x, -0.5, 0.3))
    _close(who, "minimum(a, b)", _np(bk, bk.minimum(tx, ty)), np.minimum(x, y))
    _close(who, "maximum(a, b)", _np(bk, bk.maximum(tx, ty)), np.maximum(x, y))
    _close(who, "exp(x)", _np(bk, bk.exp(tx)), np.exp(x))
    _close(who, "log(exp(x))", _np(bk, bk.log(bk.exp(tx))), x, atol=1e-5)
    _close(who, "tanh(x)", _np(bk, bk.tanh(tx)), np.tanh(x))
    big = bk.tensor(np.array([-100.0, -1.0, 0.0, 1.0, 100.0], np.float32))
    _close(
        who,
        "softplus(x) (stable for large |x|)",
        _np(bk, bk.softplus(big)),
        np.logaddexp(0.0, np.array([-100.0, -1.0, 0.0, 1.0, 100.0])),
        atol=1e-6,
    )
    for join in (0, 1, -1):
        _close(
            who,
            f"concat([a, b], axis={join})",
            _np(bk, bk.concat([tx, ty], axis=join)),
            np.concatenate([x, y], axis=join),
        )
    for axis in (None, 0, 1, -1):
        _close(who, f"mean(x, axis={axis})", _np(bk, bk.mean(tx, axis=axis)), x.mean(axis=axis))
        _close(who, f"sum(x, axis={axis})", _np(bk, bk.sum(tx, axis=axis)), x.sum(axis=axis))
    for axis in (0, 1, -1):
        _close(who, f"max(x, axis={axis})", _np(bk, bk.max(tx, axis=axis)), x.max(axis=axis))
        arg = _np(bk, bk.argmax(tx, axis=axis))
        _check(arg.dtype.kind in "iu", who, f"argmax(axis={axis}) has dtype {arg.dtype}")
        _check(
            np.array_equal(arg, x.argmax(axis=axis)),
            who,
            f"argmax(x, axis={axis}) = {arg}, expected {x.argmax(axis=axis)}",
        )


def _check_losses(bk: Any, rng: np.random.Generator, who: str) -> None:
    a = rng.uniform(-3, 3, 64).astype(np.float32)
    b = rng.uniform(-3, 3, 64).astype(np.float32)
    d = a - b
    huber = np.where(np.abs(d) < 1.0, 0.5 * d * d, np.abs(d) - 0.5)
    ta, tb = bk.tensor(a), bk.tensor(b)
    _close(who, "mse(a, b) (elementwise)", _np(bk, bk.mse(ta, tb)), d * d)
    _close(who, "smooth_l1(a, b) (elementwise, delta 1)", _np(bk, bk.smooth_l1(ta, tb)), huber)


def _forward(bk: Any, model: Any, x: np.ndarray) -> np.ndarray:
    with bk.no_grad():
        return _np(bk, model(bk.tensor(x)))


def _check_models(bk: Any, rng: np.random.Generator, who: str) -> None:
    x = rng.standard_normal((64, 3)).astype(np.float32)
    for activation in ("tanh", "relu", "elu"):
        out = _forward(bk, bk.mlp(3, [8, 8], 4, activation=activation), x)
        _check(out.shape == (64, 4), who, f"mlp(3, [8, 8], 4) gave shape {out.shape}")
        _check(bool(np.all(np.isfinite(out))), who, f"mlp({activation}) output is not finite")
    linear = _forward(bk, bk.mlp(3, [], 2), x)
    _check(linear.shape == (64, 2), who, f"mlp(3, [], 2) gave shape {linear.shape}")
    image = rng.standard_normal((5, 2, 3)).astype(np.float32)
    flat = _forward(bk, bk.mlp(6, [8], 2), image)
    _check(
        flat.shape == (5, 2),
        who,
        f"mlp(6, [8], 2) on a (5, 2, 3) batch gave {flat.shape}: models must flatten all axes "
        f"after the batch axis (algorithms size in_dim with SpaceInfo.flat_dim)",
    )
    plain = _forward(bk, bk.mlp(3, [8], 4, activation="relu"), x)
    trunk = _forward(bk, bk.mlp(3, [8], 4, activation="relu", activate_output=True), x)
    _check(bool(plain.min() < 0), who, "mlp(relu) output is never negative: output activated?")
    _check(bool(trunk.min() >= 0), who, "mlp(relu, activate_output=True) output is negative")
    small = np.abs(_forward(bk, bk.mlp(3, [16], 4, out_gain=0.01), x)).max()
    large = np.abs(_forward(bk, bk.mlp(3, [16], 4, out_gain=1.0), x)).max()
    _check(
        small < 0.1 * large,
        who,
        f"out_gain=0.01 gives outputs up to {small:.3g} vs {large:.3g} at out_gain=1: the "
        f"gain must scale the last layer's init (PPO relies on it for a near-uniform policy)",
    )
    _check_parallel_mlp(bk, x, who)
    _check_cnn(bk, rng, who)
    m1, m2 = bk.mlp(3, [8], 2), bk.mlp(3, [8], 1)
    g = bk.group(actor=m1, critic=m2)
    _close(who, "group(actor=m)['actor'](x)", _forward(bk, g["actor"], x), _forward(bk, m1, x))
    n_parts = len(bk.get_weights(m1)) + len(bk.get_weights(m2))
    _check(
        len(bk.get_weights(g)) == n_parts,
        who,
        f"get_weights(group) has {len(bk.get_weights(g))} arrays, its members {n_parts}",
    )


def _check_cnn(bk: Any, rng: np.random.Generator, who: str) -> None:
    """cnn: uint8 frames (B, C, H, W) in, (B, out_dim) ReLU features out, the input scaled
    inside, custom layers, a numpy inference copy, and a few steps of training."""
    frames = rng.integers(0, 256, size=(6, 2, 36, 36), dtype=np.uint8)
    net = bk.cnn((2, 36, 36), 16)
    with bk.no_grad():
        out = _np(bk, net(bk.tensor(frames, "uint8")))
        as_float = _np(bk, net(bk.tensor(frames.astype(np.float32))))
    _check(out.shape == (6, 16), who, f"cnn((2, 36, 36), 16) on 6 frames gave {out.shape}")
    _check(bool(np.all(np.isfinite(out))), who, "cnn output is not finite")
    _check(bool(out.min() >= 0.0), who, "cnn features are negative: the trunk ends in a ReLU")
    _close(who, "cnn on uint8 frames vs the same frames as float32", out, as_float, rtol=1e-4)
    unscaled = bk.cnn((2, 36, 36), 16, scale=1.0)
    bk.set_weights(unscaled, bk.get_weights(net))
    _close(
        who,
        "cnn(scale=1/255)(x) vs cnn(scale=1)(x / 255) with the same weights",
        _forward(bk, unscaled, frames.astype(np.float32) / 255.0),
        out,
        rtol=1e-4,
        atol=1e-4,
    )
    _close(who, "inference(cnn)(frames)", bk.inference(net)(frames), out, rtol=1e-4, atol=1e-4)
    small = bk.cnn((1, 20, 20), 8, channels=[4], kernels=[5], strides=[3])
    got = _forward(bk, small, rng.integers(0, 256, size=(3, 1, 20, 20)).astype(np.float32))
    _check(got.shape == (3, 8), who, f"cnn with one custom conv layer gave shape {got.shape}")
    opt = bk.optimizer(net, lr=1e-3)
    target = bk.tensor(np.ones((6, 16), np.float32))
    losses = []
    for _ in range(5):
        loss = bk.mean(bk.mse(net(bk.tensor(frames, "uint8")), target))
        losses.append(bk.item(loss))
        bk.update(opt, loss)
    _check(
        losses[-1] < losses[0],
        who,
        f"5 Adam steps on a cnn did not lower its regression loss ({losses[0]:.4g} -> "
        f"{losses[-1]:.4g}): its parameters do not train",
    )


def _check_parallel_mlp(bk: Any, x: np.ndarray, who: str) -> None:
    """parallel_mlp: one output per member, members independent, output gains per member."""
    net = bk.parallel_mlp(3, [16, 16], [4, 1], activation="tanh", out_gains=[0.01, 1.0])
    with bk.no_grad():
        outs = [_np(bk, o) for o in net(bk.tensor(x))]
    _check(len(outs) == 2, who, f"parallel_mlp with 2 members returned {len(outs)} outputs")
    _check(
        outs[0].shape == (64, 4) and outs[1].shape == (64, 1),
        who,
        f"parallel_mlp(3, [16, 16], [4, 1]) gave shapes {[o.shape for o in outs]}",
    )
    small, large = np.abs(outs[0]).max(), np.abs(outs[1]).max()
    _check(
        small < 0.1 * large,
        who,
        f"parallel_mlp out_gains [0.01, 1.0] give outputs up to {small:.3g} and {large:.3g}: "
        f"each member's output gain must scale its own last layer",
    )
    param = bk.parameter(np.zeros(3, np.float32))
    opt = bk.optimizer(net, lr=0.05)
    target = np.ones((64, 1), np.float32)
    for _ in range(5):  # training only the second member's loss must not move the first
        out = net(bk.tensor(x))
        bk.update(opt, bk.mean(bk.mse(out[1], bk.tensor(target))))
    with bk.no_grad():
        after = _np(bk, net(bk.tensor(x))[0])
    _close(who, "parallel_mlp member 0 after training only member 1", after, outs[0])
    with bk.no_grad():
        framework = [_np(bk, o) for o in net(bk.tensor(x))]
    numpy_copy = bk.inference(net)(x)
    for j in range(2):
        _close(who, f"inference(parallel_mlp)(x)[{j}]", numpy_copy[j], framework[j], rtol=1e-4)
    # one input per member: member j must see batch j only
    y = x[::-1].copy()
    with bk.no_grad():
        split = [_np(bk, o) for o in net([bk.tensor(x), bk.tensor(y)])]
        swapped = [_np(bk, o) for o in net(bk.tensor(y))]
    _close(who, "parallel_mlp([x, y])[0] (member 0 on x)", split[0], framework[0], rtol=1e-4)
    _close(who, "parallel_mlp([x, y])[1] (member 1 on y)", split[1], swapped[1], rtol=1e-4)
    split_np = bk.inference(net)([x, y])
    for j in range(2):
        _close(who, f"inference(parallel_mlp)([x, y])[{j}]", split_np[j], split[j], rtol=1e-4)
    for activation in ("tanh", "relu", "elu"):
        mlp = bk.mlp(3, [8, 8], 4, activation=activation)
        _close(
            who,
            f"inference(mlp({activation}))(x)",
            bk.inference(mlp)(x),
            _forward(bk, mlp, x),
            rtol=1e-4,
        )
    bk.assign(param, np.array([1.0, 2.0, 3.0], np.float32))
    _close(who, "assign(parameter, value)", _np(bk, param), np.array([1.0, 2.0, 3.0]))


def _check_distributions(bk: Any, rng: np.random.Generator, who: str) -> None:
    logits = rng.standard_normal((5, 4)).astype(np.float32)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    actions = np.array([0, 3, 1, 2, 3], np.int64)
    cat = bk.categorical(bk.tensor(logits))
    _check(isinstance(cat, Distribution), who, "categorical() lacks Distribution's methods")
    ta = bk.tensor(actions, "int64")
    _close(who, "categorical.log_prob", _np(bk, cat.log_prob(ta)), log_p[range(5), actions])
    _close(who, "categorical.entropy", _np(bk, cat.entropy()), -(np.exp(log_p) * log_p).sum(-1))
    mode = _np(bk, cat.mode())
    _check(np.array_equal(mode, logits.argmax(-1)), who, f"categorical.mode() = {mode}")
    probs = np.array([0.6, 0.3, 0.1])
    many = np.tile(np.log(probs).astype(np.float32), (4000, 1))
    draws = _np(bk, bk.categorical(bk.tensor(many)).sample())
    _check(draws.shape == (4000,), who, f"categorical.sample() shape {draws.shape}, not (4000,)")
    _check(draws.dtype.kind in "iu", who, f"categorical.sample() dtype {draws.dtype}")
    _check(bool(np.all((draws >= 0) & (draws < 3))), who, "categorical.sample() out of [0, n)")
    freq = np.bincount(draws, minlength=3) / len(draws)
    _close(who, "categorical.sample() frequencies", freq, probs, rtol=0, atol=0.05)

    mean = rng.standard_normal((5, 3)).astype(np.float32)
    log_std = rng.uniform(-1, 0.5, 3).astype(np.float32)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    z = (x - mean) / np.exp(log_std)
    ref_lp = (-0.5 * z * z - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
    ref_h = np.broadcast_to(log_std + 0.5 * (1 + np.log(2 * np.pi)), mean.shape).sum(-1)
    normal = bk.normal(bk.tensor(mean), bk.parameter(log_std))
    _close(
        who,
        "normal.log_prob (summed over action dims)",
        _np(bk, normal.log_prob(bk.tensor(x))),
        ref_lp,
    )
    _close(who, "normal.entropy (summed over action dims)", _np(bk, normal.entropy()), ref_h)
    _close(who, "normal.mode()", _np(bk, normal.mode()), mean)
    centre = np.tile(np.array([[1.0, -2.0]], np.float32), (4000, 1))
    spread = np.log(np.array([0.5, 2.0], np.float32))
    with bk.no_grad():
        s = _np(bk, bk.normal(bk.tensor(centre), bk.tensor(spread)).sample())
    _check(s.shape == (4000, 2), who, f"normal.sample() shape {s.shape}, expected (4000, 2)")
    _close(who, "normal.sample() mean", s.mean(0), [1.0, -2.0], rtol=0, atol=0.15)
    _close(who, "normal.sample() std", s.std(0), [0.5, 2.0], rtol=0.1, atol=0)


def _mean_loss(bk: Any, model: Any, x: np.ndarray, y: np.ndarray) -> Any:
    return bk.mean(bk.mse(model(bk.tensor(x))[:, 0], bk.tensor(y)))


def _check_training(bk: Any, rng: np.random.Generator, who: str) -> None:
    x = rng.standard_normal((64, 3)).astype(np.float32)
    y = (x @ np.array([0.5, -1.0, 2.0]) + 0.5).astype(np.float32)
    model = bk.mlp(3, [16], 1)
    opt = bk.optimizer(model, lr=3e-2, eps=1e-8)
    first = bk.item(_mean_loss(bk, model, x, y))
    for _ in range(100):
        norm = bk.update(opt, _mean_loss(bk, model, x, y))
    last = bk.item(_mean_loss(bk, model, x, y))
    _check(
        last < 0.2 * first,
        who,
        f"100 Adam steps on a linear regression took the loss from {first:.4g} to only "
        f"{last:.4g}: optimizer()/update() do not train the model",
    )
    _check(isinstance(norm, float) and math.isfinite(norm), who, f"update() returned {norm!r}")

    param = bk.parameter(np.zeros(3, np.float32))
    opt_p = bk.optimizer(param, lr=0.1)
    norm = bk.update(
        opt_p, bk.sum(param * bk.tensor(np.array([3, 4, 0], np.float32))), max_grad_norm=0.5
    )
    _close(who, "update(max_grad_norm=0.5) return value (the pre-clip norm)", norm, 5.0)
    _check(bool(np.any(_np(bk, param) != 0)), who, "update() did not move a parameter()")

    opt_both = bk.optimizer(model, param, lr=0.05)
    before = _snapshot(bk.get_weights(model)), _np(bk, param).copy()
    bk.set_lr(opt_both, 0.0)
    bk.update(opt_both, _mean_loss(bk, model, x, y) + bk.sum(param * param + param))
    _check(
        _same(before[0], bk.get_weights(model)) and np.array_equal(before[1], _np(bk, param)),
        who,
        "after set_lr(optimizer, 0.0), update() still changed the weights",
    )
    bk.set_lr(opt_both, 0.05)
    bk.update(opt_both, _mean_loss(bk, model, x, y) + bk.sum(param * param + param))
    _check(
        not _same(before[0], bk.get_weights(model))
        and not np.array_equal(before[1], _np(bk, param)),
        who,
        "optimizer(model, parameter) did not update both after set_lr(optimizer, 0.05)",
    )


def _check_frozen(bk: Any, rng: np.random.Generator, who: str) -> None:
    """frozen(m): m's parameters get no gradient, what feeds m still does (an actor trained
    through a critic)."""
    x = rng.standard_normal((32, 3)).astype(np.float32)
    trunk, head = bk.mlp(3, [8], 4), bk.mlp(4, [8], 1)
    opt = bk.optimizer(trunk, head, lr=0.05)
    before_trunk, before_head = _snapshot(bk.get_weights(trunk)), _snapshot(bk.get_weights(head))
    with bk.frozen(head):
        loss = bk.mean(head(trunk(bk.tensor(x))))
    bk.update(opt, loss)
    _check(
        _same(bk.get_weights(head), before_head),
        who,
        "frozen(head): an update through head still changed head's weights",
    )
    _check(
        not _same(bk.get_weights(trunk), before_trunk),
        who,
        "frozen(head): no gradient reached the trunk that feeds head",
    )
    bk.update(opt, bk.mean(head(trunk(bk.tensor(x)))))  # thawed again after the block
    _check(
        not _same(bk.get_weights(head), before_head),
        who,
        "head's weights stayed frozen after the frozen() block",
    )


def _check_weight_copies(bk: Any, rng: np.random.Generator, who: str) -> None:
    x = rng.standard_normal((16, 3)).astype(np.float32)

    def net() -> Any:
        return bk.group(trunk=bk.mlp(3, [8], 8, activate_output=True), head=bk.mlp(8, [], 2))

    def run(g: Any) -> np.ndarray:
        with bk.no_grad():
            return _np(bk, g["head"](g["trunk"](bk.tensor(x))))

    source, target, polyak = net(), net(), net()
    ws = _snapshot(bk.get_weights(source))
    wt = _snapshot(bk.get_weights(polyak))
    _check(not _same(ws, wt), who, "two mlp()s built in a row have identical weights")
    bk.copy_weights(target, source)
    _close(who, "copy_weights(tau=1) then forward", run(target), run(source), rtol=0, atol=0)
    bk.copy_weights(polyak, source, tau=0.25)
    after = bk.get_weights(polyak)
    for key in ws:
        _close(
            who, f"copy_weights(tau=0.25) on {key!r}", after[key], 0.25 * ws[key] + 0.75 * wt[key]
        )

    weights = bk.get_weights(source)
    _check(
        all(isinstance(v, np.ndarray) for v in weights.values()),
        who,
        "get_weights() values must be numpy arrays",
    )
    expected = run(source)
    for v in weights.values():
        v += 1.0
    _close(
        who, "forward after editing get_weights() output (must be a copy)", run(source), expected
    )
    fresh = net()
    bk.set_weights(fresh, ws)
    for v in ws.values():
        v += 1.0
    _close(who, "set_weights(get_weights()) then forward", run(fresh), expected)


def _check_state(bk: Any, rng: np.random.Generator, who: str) -> None:
    x = rng.standard_normal((32, 3)).astype(np.float32)
    y = rng.standard_normal(32).astype(np.float32)
    a, b = bk.mlp(3, [8], 1), bk.mlp(3, [8], 1)
    bk.load_state(b, bk.state(a))
    _close(
        who, "load_state(model, state(other)) then forward", _forward(bk, b, x), _forward(bk, a, x)
    )
    param = bk.parameter(np.array([0.5, -1.0], np.float32))
    other = bk.parameter(np.zeros(2, np.float32))
    bk.load_state(other, bk.state(param))
    _close(who, "load_state(parameter, state(parameter))", _np(bk, other), [0.5, -1.0])

    opt_a = bk.optimizer(a, lr=1e-2)
    for _ in range(3):
        bk.update(opt_a, _mean_loss(bk, a, x, y))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"agent.{bk.name}"
        payload = {"model": bk.state(a), "optimizer": bk.state(opt_a), "n": 3, "arr": y}
        bk.save(payload, path)
        loaded = bk.load(path)
    _check(isinstance(loaded, dict), who, f"load() returned {type(loaded).__name__}, not dict")
    _check(loaded.get("n") == 3, who, "save()/load() lost a plain int in the payload")
    _close(who, "save()/load() of a numpy array", loaded.get("arr"), y, rtol=0, atol=0)
    opt_b = bk.optimizer(b, lr=1e-2)
    bk.load_state(b, loaded["model"])
    bk.load_state(opt_b, loaded["optimizer"])
    bk.update(opt_a, _mean_loss(bk, a, x, y))
    bk.update(opt_b, _mean_loss(bk, b, x, y))
    _close(
        who,
        "one more step after save/load of model + optimizer state (Adam moments restored?)",
        _forward(bk, b, x),
        _forward(bk, a, x),
    )


def _draws(bk: Any) -> tuple[np.ndarray, np.ndarray]:
    with bk.no_grad():
        cat = bk.categorical(bk.tensor(np.zeros((100, 4), np.float32))).sample()
        normal = bk.normal(
            bk.tensor(np.zeros((100, 2), np.float32)), bk.tensor(np.zeros(2))
        ).sample()
    return _np(bk, cat), _np(bk, normal)


def _check_rng(bk: Any, rng: np.random.Generator, who: str) -> None:
    bk.seed(7)
    w1 = _snapshot(bk.get_weights(bk.mlp(4, [8], 3)))
    d1 = _draws(bk)
    bk.seed(7)
    w2 = _snapshot(bk.get_weights(bk.mlp(4, [8], 3)))
    d2 = _draws(bk)
    _check(_same(w1, w2), who, "seed(7) twice gave different mlp() initial weights")
    _check(
        all(np.array_equal(p, q) for p, q in zip(d1, d2, strict=True)),
        who,
        "seed(7) twice gave different samples",
    )
    bk.seed(8)
    d3 = _draws(bk)
    _check(not np.array_equal(d1[1], d3[1]), who, "seed(7) and seed(8) gave the same samples")
    state = bk.rng_state()
    first = _draws(bk)
    bk.set_rng_state(state)
    second = _draws(bk)
    _check(
        all(np.array_equal(p, q) for p, q in zip(first, second, strict=True)),
        who,
        "set_rng_state(rng_state()) did not replay the same samples",
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rng"
        bk.save({"rng": state}, path)
        bk.set_rng_state(bk.load(path)["rng"])
    third = _draws(bk)
    _check(
        all(np.array_equal(p, q) for p, q in zip(first, third, strict=True)),
        who,
        "an rng_state() that went through save()/load() did not replay the same samples",
    )
