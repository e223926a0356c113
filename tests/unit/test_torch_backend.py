"""The torch backend's shortcuts around torch internals do exactly what torch would do."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from harness_torch.backend import TorchBackend  # noqa: E402
from harness_torch.plugin import TorchConfig  # noqa: E402


def test_update_matches_torch_adam_with_clipping() -> None:
    bk = TorchBackend(TorchConfig(device="cpu", threads=1))
    net = bk.parallel_mlp(4, [16, 16], [3, 1], out_gains=[0.01, 1.0])
    ref = copy.deepcopy(net)
    opt = bk.optimizer(net, lr=3e-3, eps=1e-5)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=3e-3, eps=1e-5)
    gen = torch.Generator().manual_seed(0)
    for step in range(6):
        x = torch.randn(32, 4, generator=gen)
        if step == 3:  # schedules change the learning rate between updates
            bk.set_lr(opt, 1e-3)
            for group in ref_opt.param_groups:
                group["lr"] = 1e-3
        norm = bk.update(opt, sum(o.pow(2).sum() for o in net(x)), max_grad_norm=0.5)
        ref_opt.zero_grad()
        sum(o.pow(2).sum() for o in ref(x)).backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ref_opt.step()
        assert norm == pytest.approx(float(ref_norm), rel=1e-6)
        for p, q in zip(net.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    state, ref_state = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    for key in state:
        torch.testing.assert_close(state[key]["exp_avg_sq"], ref_state[key]["exp_avg_sq"])
        assert float(state[key]["step"]) == float(ref_state[key]["step"]) == 6.0


def test_training_does_not_import_dynamo() -> None:
    code = """
import sys, torch
from harness_torch.backend import TorchBackend
from harness_torch.plugin import TorchConfig
bk = TorchBackend(TorchConfig(device="cpu", threads=1))
net = bk.mlp(4, [8], 2)
opt = bk.optimizer(net, lr=1e-3)
bk.update(opt, net(torch.randn(3, 4)).sum(), max_grad_norm=1.0)
opt.load_state_dict(opt.state_dict())
assert "torch._dynamo" not in sys.modules, "torch._dynamo was imported"
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def test_amp_on_cpu_warns_and_trains_in_float32(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        bk = TorchBackend(TorchConfig(device="cpu", amp="bf16", threads=1))
    assert "amp = 'bf16' applies to CUDA learners only" in caplog.text
    net = bk.mlp(4, [8], 2)
    with bk.autocast():
        out = net(bk.tensor(np.ones((3, 4), np.float32)))
    assert out.dtype == torch.float32
    assert bk.device_stats() == {}


def test_bad_amp_mode_is_named() -> None:
    with pytest.raises(ValueError, match="amp = 'fp8' is not one of off, bf16, fp16"):
        TorchConfig(amp="fp8")


def test_numpy_of_half_precision_is_float32() -> None:
    bk = TorchBackend(TorchConfig(device="cpu", threads=1))
    for dtype in (torch.bfloat16, torch.float16):
        out = bk.numpy(torch.ones(3, dtype=dtype))
        assert out.dtype == np.float32 and out.tolist() == [1.0, 1.0, 1.0]


def test_farm_actors_act_on_cpu() -> None:
    """A CUDA learner's farm actors get no GPU: their copy of the config acts on the CPU."""
    from dataclasses import replace

    from harness.config import layer, resolve
    from harness.plugins import collect_registry, make_plugin_manager
    from harness.runtime.farm import acting_config

    registry = collect_registry(make_plugin_manager())
    overrides = ["backend.device='cuda:1'", "backend.amp='fp16'", "backend.threads=3"]
    config = resolve(layer(None, [], overrides, environ={}), registry)
    assert (config.backend.device, config.backend.amp) == ("cuda:1", "fp16")
    acting = acting_config(config)
    assert (acting.backend.device, acting.backend.amp, acting.backend.threads) == ("cpu", "off", 3)
    assert config.backend.device == "cuda:1"  # the learner's own config is untouched
    assert acting.run == config.run and acting.algo == config.algo
    plain = replace(config, backend=None)
    assert acting_config(plain) is plain


def test_flush_denormal_is_the_default_and_can_be_turned_off() -> None:
    """Subnormal results become zero in torch and in numpy (the farm's acting path) on the
    backend's thread and on threads it starts, unless ``flush_denormal = false``."""
    import threading

    tiny = np.float32(1e-39)  # subnormal: below float32's smallest normal 1.18e-38
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode")
    torch.set_flush_denormal(False)  # so only the backend can have turned it on
    try:

        def products() -> list[float]:
            x = torch.tensor([1e-38], dtype=torch.float32)
            return [float(x * 0.1), float(np.float32(1e-38) * np.float32(0.1))]

        for flush in (True, False):
            TorchBackend(TorchConfig(device="cpu", threads=1, flush_denormal=flush))
            seen: list[float] = []
            worker = threading.Thread(target=lambda out=seen: out.extend(products()))
            worker.start()
            worker.join()
            expected = [0.0, 0.0] if flush else [pytest.approx(float(tiny), rel=1e-2)] * 2
            assert products() == expected
            assert seen == expected
    finally:
        torch.set_flush_denormal(True)


@pytest.mark.parametrize("activation", ["relu", "tanh", "elu"])
def test_in_place_activations_give_torch_gradients(activation: str) -> None:
    """The MLPs apply their hidden activations in place on each layer's fresh output; outputs
    and every gradient (weights and input) equal the plain out-of-place functional forward."""
    fn = {"relu": torch.relu, "tanh": torch.tanh, "elu": torch.nn.functional.elu}[activation]
    bk = TorchBackend(TorchConfig(device="cpu", threads=1))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16, 5, generator=gen)

    def check(net: torch.nn.Module, reference: Any) -> None:
        inp, ref_inp = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, ref_out = net(inp), reference(ref_inp)
        out = out if isinstance(out, list) else [out]  # mlp: a tensor; parallel_mlp: a list
        for o, r in zip(out, ref_out, strict=True):
            torch.testing.assert_close(o, r)
        weights = torch.randn(sum(o.numel() for o in out), generator=gen)
        params = [*net.parameters(), inp]
        grads = torch.autograd.grad(torch.cat([o.flatten() for o in out]) @ weights, params)
        ref_params = [*net.parameters(), ref_inp]
        ref_loss = torch.cat([r.flatten() for r in ref_out]) @ weights
        ref_grads = torch.autograd.grad(ref_loss, ref_params)
        for g, r in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, r)

    mlp = bk.mlp(5, [8, 8], 3, activation=activation, activate_output=True)
    linears = [m for m in mlp if isinstance(m, torch.nn.Linear)]

    def mlp_reference(h: torch.Tensor) -> list[torch.Tensor]:
        for layer in linears:
            h = fn(torch.nn.functional.linear(h, layer.weight, layer.bias))
        return [h]

    check(mlp, mlp_reference)
    twin = bk.parallel_mlp(5, [8, 8], [1, 2], activation=activation)

    def twin_reference(h: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for j, width in enumerate((1, 2)):
            y = h
            for i, (w, b) in enumerate(zip(twin.weights, twin.biases, strict=True)):
                y = y @ w[j] + b[j]
                y = fn(y) if i < len(twin.weights) - 1 else y[:, :width]
            outs.append(y)
        return outs

    check(twin, twin_reference)


_FAULTS = """
import json, resource, sys
import numpy as np
from harness.api import EnvInfo, SpaceInfo
from harness.data import ReplayBatch
from harness_algos.td3 import TD3, TD3Config
from harness_torch.plugin import TorchConfig, load
bk = load(TorchConfig(device="cpu", threads=1, reuse_freed_memory=sys.argv[1] == "on"))
box = lambda n: SpaceInfo("box", (n,), "float32", low=(-1.0,) * n, high=(1.0,) * n)
algo = TD3(bk, EnvInfo("Pendulum-v1", box(3), box(1), 1), TD3Config(hidden=[400, 300]))
rng = np.random.default_rng(0)
f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
batch = ReplayBatch(f(256, 3), np.tanh(f(256, 1)), f(256), f(256, 3), np.zeros(256, np.float32),
                    np.ones(256, np.float32), np.arange(256))
for _ in range(20):
    algo.learn(batch, diagnostics=False)
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    algo.learn(batch, diagnostics=False)
print(json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / 20))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_reuse_freed_memory_stops_page_faults_in_updates() -> None:
    """With ``reuse_freed_memory`` (the default) a TD3 update (400x300 critics, batch 256)
    re-uses freed heap instead of mapping fresh pages: (almost) no page faults once warm. (glibc's
    defaults fault ~200-400 times per update here; each run is a fresh process, since the
    setting is process-wide.)"""

    def faults(mode: str) -> float:
        out = subprocess.run(
            [sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True
        )
        return float(out.stdout.strip().splitlines()[-1])

    on, off = faults("on"), faults("off")
    assert on * 10 < off, (on, off)  # measured here: ~6 against 200-400 per update


def test_cpu_cnn_runs_channels_last_with_the_same_numbers() -> None:
    """The CPU CNN keeps NHWC weights and inputs; outputs, gradients and the weights it hands
    to actors and checkpoints are those of the plain NCHW network."""
    from harness_torch.backend import _CNN

    bk = TorchBackend(TorchConfig(device="cpu", threads=1))
    net = bk.cnn((4, 36, 36), 32, channels=(8, 16), kernels=(4, 3), strides=(2, 1))
    plain = _CNN((4, 36, 36), 32, [(8, 4, 2), (16, 3, 1)], 1.0 / 255.0)
    plain.load_state_dict(net.state_dict())
    conv = net.convs[0].weight
    assert net.channels_last and conv.is_contiguous(memory_format=torch.channels_last)
    assert not plain.channels_last and plain.convs[0].weight.is_contiguous()
    frames = torch.randint(0, 256, (6, 4, 36, 36), dtype=torch.uint8)
    out, ref = net(frames), plain(frames)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    (out**2).sum().backward()
    (ref**2).sum().backward()
    for (name, p), q in zip(net.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    weights = bk.get_weights(net)
    assert all(w.flags["C_CONTIGUOUS"] for w in weights.values())
    np.testing.assert_array_equal(weights["convs.0.weight"], plain.convs[0].weight.detach())
    other = bk.cnn((4, 36, 36), 32, channels=(8, 16), kernels=(4, 3), strides=(2, 1))
    bk.set_weights(other, weights)
    assert other.convs[0].weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(other(frames), out.detach())


def _relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def test_int8_acting_cnn_follows_the_float_trunk_and_its_refreshes() -> None:
    """``int8_acting``: the CNN's acting copy runs quantized kernels, its features are the
    float trunk's within quantization error (uint8 frames and float inputs), and a refresh
    after ``set_weights`` follows the new weights. Off, the copy is exactly the float
    forward."""
    from harness_torch.int8 import Int8CNN

    frames = np.random.default_rng(0).integers(0, 256, (8, 4, 84, 84), dtype=np.uint8)
    plain = TorchBackend(TorchConfig(device="cpu", threads=1))
    plain.seed(0)  # the same weights every run: a CPU's quantization error is then fixed
    net = plain.cnn((4, 84, 84), 256, channels=(16, 32), kernels=(8, 4), strides=(4, 2))
    ref = plain.numpy(net(plain.tensor(frames, "uint8")))
    np.testing.assert_array_equal(plain.inference(net)(frames), ref)  # off: the float forward

    bk = TorchBackend(TorchConfig(device="cpu", threads=1, int8_acting=True))
    acting = bk.inference(net)
    assert isinstance(acting, Int8CNN)
    out = acting(frames)
    assert out.dtype == np.float32 and out.shape == ref.shape
    assert 0.0 < _relative_error(out, ref) < 0.04
    assert np.corrcoef(out.ravel(), ref.ravel())[0, 1] > 0.999

    floats = np.random.default_rng(1).normal(0.0, 60.0, (8, 4, 84, 84)).astype(np.float32)
    float_ref = bk.numpy(net(bk.tensor(floats)))
    assert _relative_error(bk.inference(net)(floats), float_ref) < 0.04

    other = plain.cnn((4, 84, 84), 256, channels=(16, 32), kernels=(8, 4), strides=(4, 2))
    bk.set_weights(net, bk.get_weights(other))
    refreshed = bk.inference(net)(frames)
    new_ref = plain.numpy(other(plain.tensor(frames, "uint8")))
    assert _relative_error(refreshed, new_ref) < 0.04
    assert _relative_error(refreshed, ref) > 0.5  # not the old weights' features


def test_int8_acting_does_not_saturate_on_bright_frames() -> None:
    """White frames through all-positive weights: the largest products the first layer can
    see. CPUs without VNNI add u8 x s8 pairs in int16; with full-range int8 weights those
    sums saturate and the features come out ~half their value (harness_torch.int8
    .weight_levels)."""
    import torch

    bk = TorchBackend(TorchConfig(device="cpu", threads=1, int8_acting=True))
    net = bk.cnn((4, 84, 84), 64, channels=(16, 32), kernels=(8, 4), strides=(4, 2))
    with torch.no_grad():
        for layer in [*net.convs, net.fc]:
            if isinstance(layer, torch.nn.Conv2d | torch.nn.Linear):
                layer.weight.fill_(0.01)
                layer.bias.zero_()
    frames = np.full((4, 4, 84, 84), 255, np.uint8)
    ref = bk.numpy(net(bk.tensor(frames, "uint8")))
    assert _relative_error(bk.inference(net)(frames), ref) < 0.01


def test_int8_acting_leaves_mlps_in_float() -> None:
    bk = TorchBackend(TorchConfig(device="cpu", threads=1, int8_acting=True))
    net = bk.mlp(4, [16], 2)
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(bk.inference(net)(x), bk.numpy(net(bk.tensor(x))), atol=1e-6)


def test_int8_acting_without_quantized_kernels_names_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A torch build without quantized CPU engines stops at start-up with the key named (real
    engine list emptied, not the check replaced)."""
    from harness.errors import ConfigError

    quantized = type(torch.backends.quantized)  # a module object whose attributes are properties
    monkeypatch.setattr(quantized, "supported_engines", property(lambda self: ["none"]))
    with pytest.raises(ConfigError, match=r"int8_acting = true.*no quantized CPU engine.*false"):
        TorchBackend(TorchConfig(device="cpu", threads=1, int8_acting=True))
    TorchBackend(TorchConfig(device="cpu", threads=1))  # off: nothing is checked
