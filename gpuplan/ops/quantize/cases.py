"""Per-token quantize, dequantize and both backwards on the emulated device: float outputs
against float64 math at the dtype's tolerance; the int8 q (and every output the module
documents as bit-identical between host and device) exactly against the host implementation."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.ops.quantize.reference import quantize_reference64, scale_reference64
from gpuplan.testing import (
    DTYPES,
    Case,
    check,
    dtype_id,
    emu,
    f64,
    host,
    random,
    run_emulated,
    run_plan,
)

N, D = 6, 300  # D > 256 threads: each thread takes two columns, the last warp partly


def _bits_equal(actual, expected: np.ndarray, what: str) -> None:
    a = np.ascontiguousarray(host(actual))
    e = np.ascontiguousarray(expected)
    assert a.dtype == e.dtype, (what, a.dtype, e.dtype)
    np.testing.assert_array_equal(a.view(np.uint8), e.view(np.uint8),
                                  err_msg=f"{what}: device bits differ from the host SKU's")


def _input(dtype) -> np.ndarray:
    x = random((N, D), dtype, seed=5, low=-4, high=4)
    x[1] = 0  # a zero row: scale 0, every q 0
    x[2, 3] = np.asarray(np.nan).astype(dtype)  # NaN is ignored by the max and quantizes to 0
    x[3, :4] = np.array([127, 0.5, 2.5, -126.5]).astype(dtype)  # exact ties: scale 1
    x[3, 4:] = np.clip(x[3, 4:], -1, 1)
    return x


def quantize(dtype) -> None:
    x = _input(dtype)
    q = emu(np.full((N, D), 99, np.int8))
    scale = emu(np.full((N,), 5, np.float32))
    run_emulated(gp.QuantizePerTokenPlan, gp.QuantizePerTokenDescriptor(N, D, dtype),
                 gp.QuantizePerTokenArgs(emu(x), q, scale))
    # Host implementation, same dtype: documented bit-identical (q and scale).
    hq, hs = np.zeros((N, D), np.int8), np.zeros(N, np.float32)
    run_plan(gp.QuantizePerTokenPlan, gp.QuantizePerTokenDescriptor(N, D, dtype),
             gp.QuantizePerTokenArgs(x, hq, hs), "cpu")
    _bits_equal(q, hq, "quantize q")
    _bits_equal(scale, hs, "quantize scale")
    # Float64 math: scale = max|x| / 127 (NaN ignored), q = round(x / scale) within one step.
    q64, s64 = quantize_reference64(x)
    check(scale, s64, np.float32, "quantize scale vs float64")
    qd = host(q).astype(np.int64)
    assert np.abs(qd - q64).max() <= 1, "quantize q more than one step from float64 math"
    assert host(scale)[3] == 1.0 and qd[3, :4].tolist() == [127, 0, 2, -126]  # half to even
    assert not qd[1].any() and qd[2, 3] == 0


def quantize_backward_convert(grad_dtype, dtype) -> None:
    """The ``copy`` SKU with d_q in another dtype (taken from the array): the convert kernel."""
    n, d = 5, 301  # a partial last block of the flat 256-thread grid
    d_q = random((n, d), grad_dtype, seed=2, low=-50, high=50)
    d_x = emu(np.full((n, d), 3, dtype))
    desc = gp.QuantizePerTokenBackwardDescriptor(n, d, dtype)
    plan = run_emulated(gp.QuantizePerTokenBackwardPlan, desc,
                        gp.QuantizePerTokenBackwardArgs(emu(d_q), d_x))
    assert plan.sku().variant == "copy", plan.sku()
    check(d_x, f64(d_q), dtype, "quantize backward (straight-through)")
    expect = np.zeros((n, d), dtype)
    run_plan(gp.QuantizePerTokenBackwardPlan, desc,
             gp.QuantizePerTokenBackwardArgs(d_q, expect), "cpu")
    _bits_equal(d_x, expect, "quantize backward convert")


def _q_and_scale(n: int, d: int):
    rng = np.random.default_rng(4)
    q = rng.integers(-127, 128, size=(n, d)).astype(np.int8)
    scale = rng.uniform(1e-3, 2.0, size=n).astype(np.float32)
    scale[1] = 0.0
    scale[2] = np.float32(1e-39)  # subnormal scale: flushed to zero on both sides
    return q, scale


def dequantize(dtype) -> None:
    q, scale = _q_and_scale(N, D)
    y = emu(np.full((N, D), 7, dtype))
    run_emulated(gp.DequantizePerTokenPlan, gp.DequantizePerTokenDescriptor(N, D, dtype),
                 gp.DequantizePerTokenArgs(emu(q), emu(scale), y))
    check(y, scale_reference64(scale)[:, None] * q, dtype, "dequantize")
    expect = np.zeros((N, D), dtype)
    run_plan(gp.DequantizePerTokenPlan, gp.DequantizePerTokenDescriptor(N, D, dtype),
             gp.DequantizePerTokenArgs(q, scale, expect), "cpu")
    _bits_equal(y, expect, "dequantize")


def dequantize_backward(dtype) -> None:
    _, scale = _q_and_scale(N, D)
    d_out = random((N, D), dtype, seed=6, low=-10, high=10)
    d_in = emu(np.full((N, D), 7, dtype))
    run_emulated(gp.DequantizePerTokenBackwardPlan,
                 gp.DequantizePerTokenBackwardDescriptor(N, D, dtype),
                 gp.DequantizePerTokenBackwardArgs(emu(scale), emu(d_out), d_in))
    check(d_in, scale_reference64(scale)[:, None] * f64(d_out), dtype, "dequantize backward")
    expect = np.zeros((N, D), dtype)
    run_plan(gp.DequantizePerTokenBackwardPlan,
             gp.DequantizePerTokenBackwardDescriptor(N, D, dtype),
             gp.DequantizePerTokenBackwardArgs(scale, d_out, expect), "cpu")
    _bits_equal(d_in, expect, "dequantize backward")


CASES = (
    [Case(f"quantize[{dtype_id(t)}]", lambda t=t: quantize(t)) for t in DTYPES]
    + [Case(f"dequantize[{dtype_id(t)}]", lambda t=t: dequantize(t)) for t in DTYPES]
    + [Case(f"dequantize backward[{dtype_id(t)}]", lambda t=t: dequantize_backward(t))
       for t in DTYPES]
    + [Case(f"quantize backward convert[{dtype_id(g)}->{dtype_id(t)}]",
            lambda g=g, t=t: quantize_backward_convert(g, t))
       for g in DTYPES for t in DTYPES if np.dtype(g) != np.dtype(t)]
)
