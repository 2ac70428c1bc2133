"""Binary kernels on the emulated device (binary contiguous and broadcast with their
gradients, the bool comparisons, bias add) against the family's float64 reference
(gpuplan.ops.binary.reference; reduced gradients at scale sqrt(n_out / size), as in
tests/gpuplan/ops/test_binary.py).

Sizes are small and odd (37): an aligned launch takes the 16-byte pack path and then the
scalar tail; one-element-off views (`common.place(a, True)`) take the scalar path alone.

Every binary_grad instance is reached through BinaryBackwardPlan: <T, T, op, *> for a
gradient that needs no reduction, <half, float, op, *> for the per-element terms of the ops
reading a and b, summed afterwards (add/sub sum dc itself, so they have no <half, float>
instance). Comparisons have forward kernels only; their bool c is compared exactly.

int32, int64 and bool run the broadcast kernel only (same shapes included) and are
compared exactly with the reference's Python-int math in the same dtype (wrapping, floor
division and remainder with Python's signs, x // 0 == x % 0 == 0); the operands include 0,
-1 and the dtype's extremes.
"""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.ops.binary.plans import BINARY_OPS, COMPARE_OPS, DIFFERENTIABLE_OPS
from gpuplan.ops.binary.reference import (
    bias_add_reference,
    binary_backward_reference,
    binary_reference,
)
from gpuplan.testing import DTYPES, Case, check, dtype_id, emu, host, place, random, run_emulated

N = 37


def _operands(a_shape, b_shape, dtype, op="add"):
    if op == "pow":  # a positive base: a negative one gives NaN for most exponents
        return (random(a_shape, dtype, seed=3, low=0.5, high=2.0),
                random(b_shape, dtype, seed=4, low=-2.0, high=2.0))
    # quarters: ties for maximum/minimum, eq...; divisions take |b| >= 0.5
    if op not in ("add", "sub", "mul", "div", "remainder", "floor_divide"):
        return tuple((np.round(random(s, np.float64, seed=k) * 4) / 4).astype(dtype)
                     for s, k in ((a_shape, 3), (b_shape, 4)))
    a = random(a_shape, dtype, seed=3)
    b = random(b_shape, dtype, seed=4, low=0.5, high=2.0)
    b = np.where(random(b_shape, np.float32, seed=5) < 0, -b, b).astype(dtype)  # |b| >= 0.5
    return a, b


def binary(dtype, op: str, a_shape: tuple, b_shape: tuple, misaligned: bool = False) -> None:
    a, b = _operands(a_shape, b_shape, dtype, op)
    desc = gp.BinaryDescriptor(op, a_shape, b_shape, dtype)
    out = desc.out_shape()
    compare = op in COMPARE_OPS
    c = place(np.full(out, 7, np.bool_ if compare else dtype), misaligned)
    plan = run_emulated(gp.BinaryPlan, desc, gp.BinaryArgs(place(a, misaligned),
                                                           place(b, misaligned), c))
    same = tuple(a_shape) == tuple(b_shape)
    assert plan.sku().variant == ("contiguous" if same else "broadcast"), plan.sku()
    ref = binary_reference(op, a, b)
    if compare:
        assert (host(c) == ref).all(), f"binary {op} {a_shape} {b_shape}"
        return
    check(c, ref, dtype, f"binary {op} {a_shape} {b_shape}")


def binary_backward(dtype, op: str, a_shape: tuple, b_shape: tuple) -> None:
    """Both gradients (da, db); a reduced one at the test suite's scale, sqrt(n_out/size)."""
    a, b = _operands(a_shape, b_shape, dtype, op)
    desc = gp.BinaryBackwardDescriptor(op, a_shape, b_shape, dtype)
    out = desc.out_shape()
    dc = random(out, dtype, seed=6)
    da, db = emu(np.full(a_shape, 7, dtype)), emu(np.full(b_shape, 7, dtype))
    run_emulated(gp.BinaryBackwardPlan, desc,
                 gp.BinaryBackwardArgs(emu(a), emu(b), emu(dc), da, db))
    ra, rb = binary_backward_reference(op, a, b, dc)
    n_out = max(1, int(np.prod(out)))
    for name, got, ref, size in (("da", da, ra, a.size), ("db", db, rb, b.size)):
        check(got, ref, dtype, f"binary backward {op} {name} {a_shape} {b_shape}",
              scale=max(4.0, np.sqrt(n_out / max(1, size))))


def _exact_operands(shape: tuple, dtype, seed: int) -> np.ndarray:
    """Small values with 0 and -1 (division edge cases), plus the extremes (overflow)."""
    d = np.dtype(dtype)
    if d == np.bool_:
        return random(shape, np.float32, seed=seed) > 0
    v = np.round(random(shape, np.float64, seed=seed) * 9).astype(d).reshape(-1)
    info = np.iinfo(d)
    v[: min(4, v.size)] = (info.min, info.max, -1, 0)[: min(4, v.size)]
    return v.reshape(shape)


def binary_exact(dtype, op: str, a_shape: tuple, b_shape: tuple) -> None:
    """An integer or bool op: the broadcast kernel, exactly equal to the reference."""
    a, b = _exact_operands(a_shape, dtype, 3), _exact_operands(b_shape, dtype, 4)
    desc = gp.BinaryDescriptor(op, a_shape, b_shape, dtype)
    out = desc.out_shape()
    c_dtype = np.bool_ if op in COMPARE_OPS else dtype
    c = emu(np.full(out, 7, c_dtype))
    plan = run_emulated(gp.BinaryPlan, desc, gp.BinaryArgs(emu(a), emu(b), c))
    assert plan.sku().variant == "broadcast", plan.sku()
    ref = binary_reference(op, a, b)
    assert ref.dtype == c_dtype, ref.dtype
    assert (host(c) == ref).all(), f"binary {op} {a_shape} {b_shape} {np.dtype(dtype)}"


def bias_add(dtype, rows: int, n: int) -> None:
    x = random((rows, n), dtype, seed=8)
    bias = random((n,), dtype, seed=9)
    y = emu(np.full((rows, n), 7, dtype))
    run_emulated(gp.BiasAddPlan, gp.BiasAddDescriptor(rows, n, dtype),
                 gp.BiasAddArgs(emu(x), emu(bias), y))
    ref = bias_add_reference(x, bias)
    check(y, ref, dtype, f"bias_add {rows}x{n}")


_SHAPES = (((N,), (N,)), ((3, 1, 5), (4, 1)), ((2, 3, 4), (4,)))


def _shape_id(sa: tuple, sb: tuple) -> str:
    return "same" if sa == sb else f"{sa}x{sb}"


_FLOAT_OPS = tuple(op.name for op in BINARY_OPS if "f" in op.kinds)
_EXACT = ((np.dtype(np.int32), "i"), (np.dtype(np.int64), "i"), (np.dtype(np.bool_), "b"))

CASES = (
    [Case(f"binary {op} {_shape_id(sa, sb)}[{dtype_id(t)}]",
          lambda t=t, op=op, sa=sa, sb=sb: binary(t, op, sa, sb))
     for t in DTYPES for op in _FLOAT_OPS for sa, sb in _SHAPES]
    + [Case(f"binary {op.name} {_shape_id(sa, sb)}[{t.name}]",
            lambda t=t, op=op.name, sa=sa, sb=sb: binary_exact(t, op, sa, sb))
       for t, kind in _EXACT for op in BINARY_OPS if kind in op.kinds for sa, sb in _SHAPES]
    + [Case(f"binary {op} same misaligned[{dtype_id(t)}]",
            lambda t=t, op=op: binary(t, op, (N,), (N,), True))
       for t in DTYPES for op in ("add", "div", "lt")]
    + [Case(f"binary backward {op} {_shape_id(sa, sb)}[{dtype_id(t)}]",
            lambda t=t, op=op, sa=sa, sb=sb: binary_backward(t, op, sa, sb))
       for t in DTYPES for op in DIFFERENTIABLE_OPS for sa, sb in _SHAPES]
    + [Case(f"bias_add scalar 7x13[{dtype_id(t)}]", lambda t=t: bias_add(t, 7, 13))
       for t in DTYPES]
    + [Case(f"bias_add packs 5x64[{dtype_id(t)}]", lambda t=t: bias_add(t, 5, 64))
       for t in DTYPES]
)
