"""The paddle backend's own choices: its merged Adam step, and the MKL code path it asks for on
AMD CPUs. (Its numerics against torch: test_backend_parity.py; its contract:
tests/contract/test_conformance.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from harness.plugins import collect_registry, make_plugin_manager
from harness.pytest_plugin import cpu_backend

pytest.importorskip("paddle", reason="paddle is not installed (pip install 'harness[paddle]')")

import paddle

from harness_paddle.backend import mkl_cpu_type


@pytest.fixture(scope="module")
def bk() -> Any:
    return cpu_backend(collect_registry(make_plugin_manager()), "paddle")


def test_adam_steps_match_per_tensor_adam_when_some_parameters_get_no_gradient(bk: Any) -> None:
    """The backend's optimiser (merged kernel where every parameter has a gradient) against
    paddle's per-tensor Adam, step by step, through steps where the head is frozen (no
    gradient for its tensors), a checkpoint restored into an optimiser that had stepped
    already, and a learning-rate change. A merged step on a partial set of gradients fails
    here ("the size of Input(grad) must be equal to Input(param)")."""
    rng = np.random.default_rng(0)
    x = bk.tensor(rng.standard_normal((32, 3)).astype(np.float32))

    def nets() -> tuple[Any, Any]:
        trunk, head = bk.mlp(3, [16], 8), bk.mlp(8, [16], 1)
        return trunk, head

    ours, theirs = nets(), nets()
    for a, b in zip(ours, theirs, strict=True):
        bk.set_weights(b, bk.get_weights(a))
    opt = bk.optimizer(*ours, lr=1e-2)
    reference = paddle.optimizer.Adam(
        learning_rate=1e-2,
        parameters=[p for m in theirs for p in m.parameters()],
        epsilon=1e-8,
        use_multi_tensor=False,
    )

    def step(frozen: bool) -> None:
        for (trunk, head), optimizer in ((ours, opt), (theirs, reference)):
            if frozen:
                with bk.frozen(head):
                    loss = bk.mean(head(trunk(x)))
            else:
                loss = bk.mean(head(trunk(x)) ** 2)
            if optimizer is opt:
                bk.update(opt, loss)
            else:
                optimizer.clear_grad(set_to_zero=False)
                loss.backward()
                optimizer.step()

    def assert_same(what: str) -> None:
        for a, b in zip(ours, theirs, strict=True):
            wa, wb = bk.get_weights(a), bk.get_weights(b)
            for key in wa:
                np.testing.assert_allclose(wa[key], wb[key], rtol=0, atol=1e-6, err_msg=what)

    for i, frozen in enumerate([False, False, True, False, True, True, False]):
        step(frozen)
        assert_same(f"step {i} ({'head frozen' if frozen else 'all'})")

    saved = bk.state(opt), [bk.state(m) for m in ours]
    step(False)
    step(True)
    # a checkpoint restored into an optimiser that has stepped already
    resumed_nets = nets()
    resumed = bk.optimizer(*resumed_nets, lr=1e-2)
    bk.update(resumed, bk.mean(resumed_nets[1](resumed_nets[0](x))))
    bk.load_state(resumed, saved[0])
    for m, state in zip(resumed_nets, saved[1], strict=True):
        bk.load_state(m, state)
    for frozen in (False, True):
        if frozen:
            with bk.frozen(resumed_nets[1]):
                loss = bk.mean(resumed_nets[1](resumed_nets[0](x)))
        else:
            loss = bk.mean(resumed_nets[1](resumed_nets[0](x)) ** 2)
        bk.update(resumed, loss)
    for a, b in zip(ours, resumed_nets, strict=True):
        wa, wb = bk.get_weights(a), bk.get_weights(b)
        for key in wa:
            np.testing.assert_allclose(wb[key], wa[key], rtol=0, atol=1e-6, err_msg="resumed")

    bk.set_lr(opt, 0.0)
    reference.set_lr(0.0)
    before = [bk.get_weights(m) for m in ours]
    step(False)
    assert_same("after the learning rate changed")
    for m, old in zip(ours, before, strict=True):
        for key, value in bk.get_weights(m).items():
            np.testing.assert_array_equal(value, old[key], err_msg="lr 0 still moved " + key)


@pytest.mark.parametrize(
    ("vendor", "flags", "expected"),
    [
        ("AuthenticAMD", {"avx", "avx2", "fma", "sse4_2"}, "5"),
        ("HygonGenuine", {"avx2", "fma"}, "5"),
        ("AuthenticAMD", {"avx", "sse4_2"}, None),  # no AVX2 kernels to ask for
        ("GenuineIntel", {"avx2", "fma", "avx512f"}, None),  # MKL dispatches Intel itself
        ("", set(), None),  # not Linux, or no /proc/cpuinfo
    ],
)
def test_mkl_code_path_is_asked_for_only_on_amd_with_avx2(
    vendor: str, flags: set[str], expected: str | None
) -> None:
    assert mkl_cpu_type(vendor, frozenset(flags)) == expected


@pytest.mark.parametrize("preset", [None, ""])
def test_importing_the_backend_sets_the_mkl_variable_for_this_cpu_unless_the_user_did(
    preset: str | None,
) -> None:
    """In a fresh process: the backend module sets MKL_DEBUG_CPU_TYPE as mkl_cpu_type says for
    this machine's CPU, before paddle runs a product; a value already in the environment
    (even an empty one) is the user's and stays."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_DEBUG_CPU_TYPE"}
    if preset is not None:
        env["MKL_DEBUG_CPU_TYPE"] = preset
    script = (
        "import json, os\n"
        "from harness.cpus import cpu_features\n"
        "import harness_paddle.backend as b\n"
        "print(json.dumps([os.environ.get('MKL_DEBUG_CPU_TYPE'),"
        " b.mkl_cpu_type(*cpu_features())]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    value, wanted = json.loads(proc.stdout.strip().splitlines()[-1])
    assert value == (preset if preset is not None else wanted)
