"""PaddlePaddle, imported the way this plugin needs it: the MKL code path for this CPU asked
for before paddle's MKL runs its first product, paddle's C++ INFO lines off, its import-time
warnings and logging set-up undone. Every module of the plugin takes ``paddle`` from here, so
whichever of them is imported first, the set-up comes first."""

from __future__ import annotations

import logging
import os
import warnings

from harness.cpus import cpu_features

__all__ = ["F", "core", "mkl_cpu_type", "nn", "paddle"]


def mkl_cpu_type(vendor: str, flags: frozenset[str]) -> str | None:
    """The ``MKL_DEBUG_CPU_TYPE`` paddle's bundled MKL needs on this CPU, or None.

    Paddle's CPU wheels ship an older MKL (``paddle/libs/libmklml_intel.so``) whose dispatcher
    gives CPUs that do not say ``GenuineIntel`` its generic kernels: paddle's float32 matrix
    products ran at 17 GFLOP/s on one core of an AVX2 AMD EPYC, where torch (a newer MKL)
    reaches 70. That MKL still honours ``MKL_DEBUG_CPU_TYPE=5`` (its AVX2 kernels): 75
    GFLOP/s, and a SAC update 55 -> 30 ms (docs/benchmarks.md). Only for AMD and Hygon CPUs
    that have AVX2 and FMA (on any other CPU those kernels could be slower, or illegal)."""
    if vendor in ("AuthenticAMD", "HygonGenuine") and {"avx2", "fma"} <= flags:
        return "5"
    return None


# before paddle's MKL runs its first product (it reads the variable then); a value the user
# set (even an empty one) is kept. Actor processes inherit it.
_MKL_CPU_TYPE = mkl_cpu_type(*cpu_features())
if _MKL_CPU_TYPE is not None:
    os.environ.setdefault("MKL_DEBUG_CPU_TYPE", _MKL_CPU_TYPE)
os.environ.setdefault("GLOG_minloglevel", "2")  # paddle's C++ INFO lines on every first op
_root = logging.getLogger()
_root_setup = (list(_root.handlers), _root.level, _root.propagate)
with warnings.catch_warnings():
    # paddle.utils.cpp_extension warns at import that ccache is missing (it compiles nothing)
    warnings.simplefilter("ignore", UserWarning)
    import paddle
    import paddle.nn.functional as F
    from paddle import nn
    from paddle.base import core
# paddle.distributed's import configures the ROOT logger (an INFO handler of its own format,
# propagate off): put the application's logging back as it was
_root.handlers[:], _root.level, _root.propagate = _root_setup
