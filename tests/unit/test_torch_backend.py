"""The torch backend's shortcuts around torch internals do exactly what torch would do."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from harness_torch.backend import TorchBackend  # noqa: E402
from harness_torch.plugin import TorchConfig  # noqa: E402


def test_update_matches_torch_adam_with_clipping() -> None:
    bk = TorchBackend(TorchConfig(threads=1))
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
bk = TorchBackend(TorchConfig(threads=1))
net = bk.mlp(4, [8], 2)
opt = bk.optimizer(net, lr=1e-3)
bk.update(opt, net(torch.randn(3, 4)).sum(), max_grad_norm=1.0)
opt.load_state_dict(opt.state_dict())
assert "torch._dynamo" not in sys.modules, "torch._dynamo was imported"
"""
    subprocess.run([sys.executable, "-c", code], check=True)
