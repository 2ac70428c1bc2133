"""GEMM on the emulated device (the NVRTC ``tiled`` SKU: tensor-core kernels for f16/bf16,
scalar-copy and cp.async (VEC) tile loads; FMA kernels for f32/f64; each without and with
every activation epilogue, the pre-activation saved or not) and the cuBLAS SKU's own
kernels gemm_scale_bias and gemm_activation, against float64 NumPy math.

Tolerance as tests/gpuplan/ops/test_gemm.py: |err| <= rtol * (|ref| + |beta * C0| + |bias|)
+ atol * sqrt(K) with the dtype's (rtol, atol): a sum of K products grows like sqrt(K), and
an addend may be rounded once more before the final rounding.

GPU_CASES run the cuBLAS SKU itself (every dtype, every transpose pair, bias, alpha/beta,
an activation epilogue with the pre-activation saved): cuBLAS is a GPU library, so they run
where the device is a real GPU (`check_kernels.py --execute --device cuda`, the GPU check),
and the emulated device lists them as not run.

gemm_scale_bias and gemm_activation are launched only by the cuBLAS SKU (C = beta * C + bias
before a beta = 1 cuBLAS call; preact = C, C = f(C) after it), which the emulated device
does not have; their cases call that SKU's launch methods, GemmPlan._scale_bias and
GemmPlan._activation, on a plan selected for the emulated stream.
"""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan import testing as common
from gpuplan.dtypes import HALF_DTYPES
from gpuplan.ops.gemm.reference import (
    assert_gemm_close,
    gemm_epilogue_reference,
    gemm_operands,
    gemm_reference,
)
from gpuplan.ops.gemm.sku import EPILOGUE_ACTIVATIONS
from gpuplan.testing import DTYPES, Case, dtype_id, emu, f64, host, run_emulated

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
    pre = emu(np.full(desc.c_shape(), np.nan, desc.dtype)) if desc.save_preact else None
    plan = run_emulated(gp.GemmPlan, desc, gp.GemmArgs(ad, bd, c, emu(bias), preact=pre,
                                                       alpha=alpha, beta=beta))
    assert plan.sku().variant == "tiled", plan.sku()
    want_pre = gemm_reference(desc, a, b, c0, bias, alpha, beta)
    if desc.epilogue == "none":
        assert_gemm_close(c, want_pre, desc, c0, bias, what="gemm tiled", beta=beta)
        return
    assert_gemm_close(c, gemm_epilogue_reference(desc, want_pre), desc, c0, bias,
                      what=f"gemm tiled {desc.epilogue}", beta=beta, pre=want_pre)
    if pre is not None:
        assert_gemm_close(pre, want_pre, desc, c0, bias, what="gemm tiled preact", beta=beta)


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


def activation_pass(dtype, epilogue: str, save: bool) -> None:
    """The cuBLAS SKU's activation pass (gemm_activation) over a C already computed."""
    desc = gp.GemmDescriptor(7, 45, 3, batch=3, dtype=dtype, epilogue=epilogue,
                             save_preact=save)
    a, b, c0, _ = gemm_operands(desc, seed=23)
    c0 = (4 * c0.astype(np.float64)).astype(dtype)  # past GELU's knee on both sides
    c = emu(c0.copy())
    pre = emu(np.full(desc.c_shape(), np.nan, dtype)) if save else None
    stream = common.stream()
    plan = gp.GemmPlan.select(stream, desc, gp.PlanPreference(backend=gp.BackendKind.NVRTC))
    plan._activation(stream, gp.GemmArgs(emu(a), emu(b), c, preact=pre))
    stream.synchronize()
    common.check(c, gemm_epilogue_reference(desc, f64(c0)), dtype, f"gemm_activation "
                 f"{epilogue}", scale=4)
    if save:
        np.testing.assert_array_equal(host(pre), c0)


def _epilogue_cases() -> list[Case]:
    """Every tiled instance with an activation epilogue: half types through both tile
    loads (extents % 8: cp.async; odd: scalar), f32/f64 through the FMA kernels; with
    alpha, beta, a bias, a batch, and the pre-activation saved in every other case."""
    cases = []
    for e, epi in enumerate(EPILOGUE_ACTIVATIONS):
        for t in (*HALF_DTYPES, np.float32, np.float64):
            half = t in HALF_DTYPES
            for i, (ta, tb) in enumerate(FLAGS):
                for vec in ((False, True) if half else (None,)):
                    m, n, k = (40, 24, 72) if vec else (23, 41, 37)
                    d = gp.GemmDescriptor(m, n, k, batch=2, trans_a=ta, trans_b=tb,
                                          has_bias=True, dtype=t, epilogue=epi,
                                          save_preact=(i + e) % 2 == 0)
                    name = (f"{epi} {_flags_id(ta, tb)} "
                            f"{'' if vec is None else ('vec ' if vec else 'scalar ')}"
                            f"[{dtype_id(t)}]")
                    cases.append(Case(name, lambda d=d, vec=vec, i=i: tiled(
                        d, vec, 40 + i, 2.5, 0.75 if i % 2 else 0.0)))
    return cases


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
    + _epilogue_cases()
    + [Case(f"activation pass {epi} save={save}[{dtype_id(t)}]",
            lambda t=t, epi=epi, save=save: activation_pass(t, epi, save))
       for t in DTYPES for epi in EPILOGUE_ACTIVATIONS for save in (False, True)]
)


def cublas(desc: gp.GemmDescriptor, seed: int, alpha: float, beta: float) -> None:
    """The cuBLAS SKU (GemmPlan selected with backend=CUBLAS) against float64 math."""
    a, b, c0, bias = gemm_operands(desc, seed)
    if beta == 0:
        c0 = np.full(desc.c_shape(), np.nan, desc.dtype)  # beta == 0 never reads C
    c = emu(c0.copy())
    pre = emu(np.full(desc.c_shape(), np.nan, desc.dtype)) if desc.save_preact else None
    plan = run_emulated(gp.GemmPlan, desc, gp.GemmArgs(emu(a), emu(b), c, emu(bias), preact=pre,
                                                       alpha=alpha, beta=beta),
                        gp.PlanPreference(backend=gp.BackendKind.CUBLAS))
    assert plan.sku().variant == "cublas", plan.sku()
    want_pre = gemm_reference(desc, a, b, c0, bias, alpha, beta)
    if desc.epilogue == "none":
        assert_gemm_close(c, want_pre, desc, c0, bias, what="gemm cublas", beta=beta)
        return
    assert_gemm_close(c, gemm_epilogue_reference(desc, want_pre), desc, c0, bias,
                      what=f"gemm cublas {desc.epilogue}", beta=beta, pre=want_pre)
    if pre is not None:
        assert_gemm_close(pre, want_pre, desc, c0, bias, what="gemm cublas preact", beta=beta)


def _cublas_cases() -> list[Case]:
    cases = []
    for t in DTYPES:
        for i, (ta, tb) in enumerate(FLAGS):
            bc = BROADCASTS[i]
            d = gp.GemmDescriptor(72, 48, 136, batch=1 if bc == "both" else 3, trans_a=ta,
                                  trans_b=tb, has_bias=i % 2 == 0,
                                  broadcast_a=bc in ("a", "both"),
                                  broadcast_b=bc in ("b", "both"), dtype=t)
            cases.append(Case(f"cublas {_flags_id(ta, tb)} bcast={bc}[{dtype_id(t)}]",
                              lambda d=d, i=i: cublas(d, 50 + i, 1.5, 0.5 if i % 2 else 0.0)))
        d = gp.GemmDescriptor(40, 64, 96, has_bias=True, dtype=t,
                              epilogue=EPILOGUE_ACTIVATIONS[0], save_preact=True)
        cases.append(Case(f"cublas {EPILOGUE_ACTIVATIONS[0]} saved[{dtype_id(t)}]",
                          lambda d=d: cublas(d, 60, 1.0, 0.25)))
    return cases


#: Cases that need a real GPU (cuBLAS); see the module docstring.
GPU_CASES = _cublas_cases()
