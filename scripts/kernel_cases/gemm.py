"""GEMM on the emulated device (the NVRTC ``tiled`` SKU: tensor-core kernels for f16/bf16,
scalar-copy and cp.async (VEC) tile loads; FMA kernels for f32/f64) and the cuBLAS SKU's
epilogue kernel gemm_scale_bias, against float64 NumPy math.

Tolerance as tests/gpuplan/ops/test_gemm.py: |err| <= rtol * (|ref| + |beta * C0| + |bias|)
+ atol * sqrt(K) with the dtype's (rtol, atol): a sum of K products grows like sqrt(K), and
an addend may be rounded once more before the final rounding.

gemm_scale_bias is launched only by the cuBLAS SKU (C = beta * C + bias before a beta = 1
cuBLAS call), which the emulated device does not have; its cases call that SKU's launch
method, GemmPlan._scale_bias, on a plan selected for the emulated stream.
"""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import HALF_DTYPES
from gpuplan.testing import assert_gemm_close, gemm_operands, gemm_reference
from kernel_cases import common
from kernel_cases.common import DTYPES, Case, dtype_id, emu, f64, host, run_emulated

FLAGS = [(False, False), (False, True), (True, False), (True, True)]
BROADCASTS = ("none", "a", "b", "both")


def _flags_id(ta: bool, tb: bool) -> str:
    return ("t" if ta else "n") + ("t" if tb else "n")


def tiled(desc: gp.GemmDescriptor, vec: bool | None, seed: int, alpha: float = 1.0,
          beta: float = 0.0) -> None:
    """Run the tiled SKU; vec (half types): whether the cp.async instance must be chosen."""
    a, b, c0, bias = gemm_operands(desc, seed)
    if beta == 0:
        c0 = np.full(desc.c_shape(), np.nan, desc.dtype)  # beta == 0 never reads C
    c = emu(c0.copy())
    ad, bd = emu(a), emu(b)
    if vec is not None:
        # The instance the plan will pick (gemm.py _run_tiled): contiguous extents % 8 and
        # 16-byte aligned bases (emulated allocations are 256-byte aligned).
        ca = desc.m if desc.trans_a else desc.k
        cb = desc.k if desc.trans_b else desc.n
        picks = (ca % 8 == 0 and cb % 8 == 0 and ad.data.ptr % 16 == 0
                 and bd.data.ptr % 16 == 0)
        assert picks == vec, f"case meant for VEC={vec} would launch VEC={picks}"
    plan = run_emulated(gp.GemmPlan, desc, gp.GemmArgs(ad, bd, c, emu(bias), alpha, beta))
    assert plan.sku().variant == "tiled", plan.sku()
    assert_gemm_close(c, gemm_reference(desc, a, b, c0, bias, alpha, beta), desc, c0, bias,
                      what="gemm tiled", beta=beta)


def scale_bias(dtype, beta: float, has_bias: bool) -> None:
    desc = gp.GemmDescriptor(7, 45, 3, batch=3, has_bias=has_bias, dtype=dtype)
    a, b, c0, bias = gemm_operands(desc, seed=21)
    if beta == 0:
        c0 = np.full(desc.c_shape(), np.nan, dtype)
    c = emu(c0.copy())
    stream = common.stream()
    plan = gp.GemmPlan.select(stream, desc, gp.PlanPreference(backend=gp.BackendKind.NVRTC))
    plan._scale_bias(stream, gp.GemmArgs(emu(a), emu(b), c, emu(bias), beta=beta))
    stream.synchronize()
    expected = np.zeros(desc.c_shape()) if beta == 0 else beta * f64(c0)
    if has_bias:
        expected = expected + f64(bias)
    d0 = gp.GemmDescriptor(7, 45, 0, batch=3, has_bias=has_bias, dtype=dtype)
    assert_gemm_close(c, expected, d0, c0, bias, what="gemm_scale_bias", beta=beta)
    assert host(c).shape == (3, 7, 45)


def _tc_cases() -> list[Case]:
    cases = []
    for t in HALF_DTYPES:
        for i, (ta, tb) in enumerate(FLAGS):
            bc = BROADCASTS[i]
            # Scalar tile loads: odd extents, batch/broadcast, alpha/beta/bias, 2 k-tiles.
            d = gp.GemmDescriptor(23, 41, 37, batch=1 if bc == "both" else 3, trans_a=ta,
                                  trans_b=tb, has_bias=True, broadcast_a=bc in ("a", "both"),
                                  broadcast_b=bc in ("b", "both"), dtype=t)
            cases.append(Case(f"tc scalar {_flags_id(ta, tb)} bcast={bc}[{dtype_id(t)}]",
                              lambda d=d, i=i: tiled(d, False, i, -1.25, 0.75)))
            # cp.async loads: extents % 8; 6 k-tiles (> STAGES: the ring wraps); M and/or N
            # > 128 (several blocks); beta == 0 (C holds NaN) with and without bias.
            bc2 = BROADCASTS[(i + 1) % 4]
            m, n = (136 if i % 2 == 0 else 40), (144 if i >= 2 else 24)
            d = gp.GemmDescriptor(m, n, 168, batch=1 if bc2 == "both" else 2, trans_a=ta,
                                  trans_b=tb, has_bias=i % 2 == 0,
                                  broadcast_a=bc2 in ("a", "both"),
                                  broadcast_b=bc2 in ("b", "both"), dtype=t)
            cases.append(Case(f"tc vec {_flags_id(ta, tb)} bcast={bc2}[{dtype_id(t)}]",
                              lambda d=d, i=i: tiled(d, True, 10 + i, 0.5, 0.0)))
    return cases


def _fma_cases() -> list[Case]:
    cases = []
    for t in (np.float32, np.float64):
        for i, (ta, tb) in enumerate(FLAGS):
            bc = BROADCASTS[i]
            # f64 tiles are 64x64: n = 70 gives two column blocks there; k = 19 three k-tiles.
            d = gp.GemmDescriptor(23, 70, 19, batch=1 if bc == "both" else 2, trans_a=ta,
                                  trans_b=tb, has_bias=i < 2, broadcast_a=bc in ("a", "both"),
                                  broadcast_b=bc in ("b", "both"), dtype=t)
            cases.append(Case(f"fma {_flags_id(ta, tb)} bcast={bc}[{dtype_id(t)}]",
                              lambda d=d, i=i: tiled(d, None, 20 + i, -1.25,
                                                     0.75 if i % 2 else 0.0)))
            # Several blocks both ways (f32 tiles 128x128), K not a multiple of the k-tile.
            d = gp.GemmDescriptor(136, 264, 75, trans_a=ta, trans_b=tb, dtype=t)
            cases.append(Case(f"fma {_flags_id(ta, tb)} 136x264x75[{dtype_id(t)}]",
                              lambda d=d, i=i: tiled(d, None, 30 + i, 1.0, -0.5)))
    return cases


CASES = (
    _tc_cases()
    + _fma_cases()
    + [Case(f"scale_bias beta={beta} bias={hb}[{dtype_id(t)}]",
            lambda t=t, beta=beta, hb=hb: scale_bias(t, beta, hb))
       for t in DTYPES for beta, hb in ((0.75, True), (0.0, True), (-0.5, False))]
)
