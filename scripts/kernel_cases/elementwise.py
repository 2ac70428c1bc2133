"""Elementwise kernels on the emulated device (binary contiguous and broadcast with their
gradients, bias add, cast) against the family's NumPy implementation run
in float64 (scale 4 for the transcendental activations and for reduced gradients, as in
tests/gpuplan/ops/test_elementwise.py). Casts are compared bit for bit with the exactly
once-rounded value (truncation for integer targets), computed with Fractions (an independent
reference; NumPy's own astype to bf16 rounds f64 and integers through f32, which is why the
host SKU rounds to odd in f32 first), and the inputs include ties only a single rounding
resolves, int64 beyond 2**53 included.

Sizes are small and odd (37): an aligned launch takes the 16-byte pack path and then the
scalar tail; one-element-off views (`_misaligned`) take the scalar path alone.

binary_grad<f16|bf16, float, add|sub, *> are declared but no plan launches them (add/sub
gradients that need a reduction go straight to the reduction kernels); the `dead grad`
cases reach them through BinaryBackwardPlan._grad with an f32 destination.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import (
    FLOAT_DTYPES,
    HALF_DTYPES,
    accumulator,
    bfloat16,
    cuda_name,
    float16,
    int32,
    int64,
)
from gpuplan.ops import elementwise as ew
from kernel_cases import common
from kernel_cases.common import (
    DTYPES,
    Case,
    check,
    dtype_id,
    emu,
    f64,
    host,
    random,
    run_emulated,
    run_reference,
)

N = 37
CAST_DTYPES = FLOAT_DTYPES + (int32, int64)


def _misaligned(a: np.ndarray):
    """An emulated copy of 1-D `a` one element past a 256-byte boundary (no 16-byte packs)."""
    buf = emu(np.zeros(a.shape[0] + 1, a.dtype))[1:]
    buf[...] = a
    return buf


def _place(a: np.ndarray, misaligned: bool):
    return _misaligned(a) if misaligned else emu(a)


# -- binary --------------------------------------------------------------------------------


def _operands(a_shape, b_shape, dtype):
    a = random(a_shape, dtype, seed=3)
    b = random(b_shape, dtype, seed=4, low=0.5, high=2.0)
    b = np.where(random(b_shape, np.float32, seed=5) < 0, -b, b).astype(dtype)  # |b| >= 0.5
    return a, b


def binary(dtype, op: str, a_shape: tuple, b_shape: tuple, misaligned: bool = False) -> None:
    a, b = _operands(a_shape, b_shape, dtype)
    desc = gp.BinaryDescriptor(op, a_shape, b_shape, dtype)
    out = desc.out_shape()
    place = _misaligned if misaligned else emu
    c = place(np.full(out, 7, dtype))
    plan = run_emulated(gp.BinaryPlan, desc, gp.BinaryArgs(place(a), place(b), c))
    same = tuple(a_shape) == tuple(b_shape)
    assert plan.sku().variant == ("contiguous" if same else "broadcast"), plan.sku()
    ref = np.zeros(out)
    run_reference(gp.BinaryPlan, gp.BinaryDescriptor(op, a_shape, b_shape, np.float64),
                  gp.BinaryArgs(f64(a), f64(b), ref))
    check(c, ref, dtype, f"binary {op} {a_shape} {b_shape}")


def binary_backward(dtype, op: str, a_shape: tuple, b_shape: tuple) -> None:
    """Both gradients (da, db); a reduced one at the test suite's scale, sqrt(n_out/size)."""
    a, b = _operands(a_shape, b_shape, dtype)
    out = gp.BinaryDescriptor(op, a_shape, b_shape, dtype).out_shape()
    dc = random(out, dtype, seed=6)
    da, db = emu(np.full(a_shape, 7, dtype)), emu(np.full(b_shape, 7, dtype))
    run_emulated(gp.BinaryBackwardPlan, gp.BinaryBackwardDescriptor(op, a_shape, b_shape, dtype),
                 gp.BinaryBackwardArgs(emu(a), emu(b), emu(dc), da, db))
    ra, rb = np.zeros(a_shape), np.zeros(b_shape)
    run_reference(gp.BinaryBackwardPlan,
                  gp.BinaryBackwardDescriptor(op, a_shape, b_shape, np.float64),
                  gp.BinaryBackwardArgs(f64(a), f64(b), f64(dc), ra, rb))
    n_out = max(1, int(np.prod(out)))
    for name, got, ref, size in (("da", da, ra, a.size), ("db", db, rb, b.size)):
        check(got, ref, dtype, f"binary backward {op} {name} {a_shape} {b_shape}",
              scale=max(4.0, np.sqrt(n_out / max(1, size))))


def dead_grad(dtype, op: str, which: int) -> None:
    """binary_grad<T, f32, add|sub, which> through the plan's own _grad launch."""
    name = f"binary_grad<{cuda_name(dtype)}, {cuda_name(accumulator(dtype))}, " \
           f"{ew.BINARY_OPS.index(op)}, {which}>"
    assert name in ew._MODULE.name_expressions, name
    a_shape, b_shape = (3, 1, 5), (4, 1)
    a, b = _operands(a_shape, b_shape, dtype)
    desc = gp.BinaryBackwardDescriptor(op, a_shape, b_shape, dtype)
    out = desc.out_shape()
    dc = random(out, dtype, seed=7)
    dst = emu(np.full(out, 7, np.float32))
    stream = common.stream()
    plan = gp.BinaryBackwardPlan.select(stream, desc,
                                        gp.PlanPreference(backend=gp.BackendKind.NVRTC))
    _, dims = ew.broadcast_dims("binary_backward", a_shape, b_shape)
    plan._grad(stream, emu(a), emu(b), emu(dc), dst, int(np.prod(out)), dims,
               ew.BINARY_OPS.index(op), which)
    stream.synchronize()
    sign = -1.0 if op == "sub" and which == 1 else 1.0
    check(dst, sign * f64(dc), np.float32, f"binary_grad {op} term {which} into f32")


def _dead_grad_cases() -> list[Case]:
    cases = []
    for t in HALF_DTYPES:
        for op in ("add", "sub"):
            for w in (0, 1):
                name = (f"binary_grad<{cuda_name(t)}, float, {ew.BINARY_OPS.index(op)}, {w}>")
                if name in ew._MODULE.name_expressions:  # (dropped once declared only as used)
                    cases.append(Case(f"dead grad {op} {w}[{dtype_id(t)}]",
                                      lambda t=t, op=op, w=w: dead_grad(t, op, w)))
    return cases


# -- bias add and cast -------------------------------------------------------------------


def bias_add(dtype, rows: int, n: int) -> None:
    x = random((rows, n), dtype, seed=8)
    bias = random((n,), dtype, seed=9)
    y = emu(np.full((rows, n), 7, dtype))
    run_emulated(gp.BiasAddPlan, gp.BiasAddDescriptor(rows, n, dtype),
                 gp.BiasAddArgs(emu(x), emu(bias), y))
    ref = np.zeros((rows, n))
    run_reference(gp.BiasAddPlan, gp.BiasAddDescriptor(rows, n, np.float64),
                  gp.BiasAddArgs(f64(x), f64(bias), ref))
    check(y, ref, dtype, f"bias_add {rows}x{n}")


#: (significand bits, min normal exponent, max exponent) of the float cast targets.
_FORMATS = {np.dtype(np.float64): (53, -1022, 1023), np.dtype(np.float32): (24, -126, 127),
            np.dtype(float16): (11, -14, 15), np.dtype(bfloat16): (8, -126, 127)}


def _round_exact(v: Fraction, fmt: tuple[int, int, int]) -> float:
    """v rounded once to nearest even in the format (subnormals and overflow to inf)."""
    bits, emin, emax = fmt
    if v == 0:
        return 0.0
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e += 1 if Fraction(2) ** e <= a / 2 else 0
    e -= 1 if Fraction(2) ** e > a else 0
    ulp = Fraction(2) ** (max(e, emin) - bits + 1)
    q, r = divmod(a, ulp)
    q += 1 if r > ulp / 2 or (r == ulp / 2 and q % 2) else 0
    out = math.inf if q * ulp >= Fraction(2) ** (emax + 1) else float(q * ulp)
    return out if v > 0 else -out


def cast(src, dst, misaligned: bool = False) -> None:
    """Float targets: exactly the once-rounded (nearest even) value of the exact input, an
    independent reference (NumPy's own astype to bf16 rounds f64 and integers through f32);
    integer targets: truncation toward zero, exact. Plus the dtype tolerance vs float64."""
    src, dst = np.dtype(src), np.dtype(dst)
    vals = random((N,), np.float64, seed=10, low=-100, high=100)
    vals[:4] = [0.0, -0.0, 99.5, -2.5]
    if src.kind == "i":
        x = np.trunc(vals).astype(src)
        # Nearest-even ties only a single rounding gets right (bf16 and, for the first,
        # f16 overflow); for int64 also one beyond 2**53, where int -> double rounds.
        x[4:6] = [2**24 + 2**16 + 1, -(2**30 + 2**22 + 1)]
        if src == np.int64 and dst.kind == "f":
            x[6] = 2**62 + 2**54 + 1
        exact = [Fraction(int(v)) for v in x]
    else:
        vals[4:6] = [1 + 2.0**-8 + 2.0**-40, -(1 + 2.0**-11 + 2.0**-40)]  # bf16 / f16 ties+
        x = vals.astype(src)
        exact = [Fraction(float(v)) for v in x]
    y = _place(np.full((N,), 7, dst), misaligned)
    run_emulated(gp.CastPlan, gp.CastDescriptor(N, src, dst),
                 gp.CastArgs(_place(x, misaligned), y))
    got = np.ascontiguousarray(host(y))
    if dst.kind == "i":  # truncation toward zero: exact
        np.testing.assert_array_equal(got, np.array([math.trunc(v) for v in exact], dst),
                                      err_msg=f"cast {src}->{dst}")
        return
    expect = np.array([_round_exact(v, _FORMATS[dst]) for v in exact], np.float64)
    expect = np.copysign(expect, f64(x)).astype(dst)  # keeps -0.0 (a Fraction has no sign)
    np.testing.assert_array_equal(got.view(np.uint8), expect.view(np.uint8),
                                  err_msg=f"cast {src}->{dst}: not the once-rounded value")
    finite = np.isfinite(got.astype(np.float64))
    check(got[finite], f64(x)[finite], dst, f"cast {src}->{dst}")


def _bias_cast_cases() -> list[Case]:
    cases = []
    for t in DTYPES:
        cases.append(Case(f"bias_add scalar 7x13[{dtype_id(t)}]",
                          lambda t=t: bias_add(t, 7, 13)))
        cases.append(Case(f"bias_add packs 5x64[{dtype_id(t)}]",
                          lambda t=t: bias_add(t, 5, 64)))
    for i, s in enumerate(CAST_DTYPES):
        for j, d in enumerate(CAST_DTYPES):
            mis = (i + j) % 3 == 0  # a third of the pairs also through the scalar path
            cases.append(Case(f"cast {dtype_id(s)}->{dtype_id(d)}",
                              lambda s=s, d=d: cast(s, d)))
            if mis:
                cases.append(Case(f"cast misaligned {dtype_id(s)}->{dtype_id(d)}",
                                  lambda s=s, d=d: cast(s, d, True)))
    return cases


_SHAPES = (((N,), (N,)), ((3, 1, 5), (4, 1)), ((2, 3, 4), (4,)))


def _shape_id(sa: tuple, sb: tuple) -> str:
    return "same" if sa == sb else f"{sa}x{sb}"


CASES = (
    [Case(f"binary {op} {_shape_id(sa, sb)}[{dtype_id(t)}]",
            lambda t=t, op=op, sa=sa, sb=sb: binary(t, op, sa, sb))
       for t in DTYPES for op in ew.BINARY_OPS for sa, sb in _SHAPES]
    + [Case(f"binary {op} same misaligned[{dtype_id(t)}]",
            lambda t=t, op=op: binary(t, op, (N,), (N,), True))
       for t in DTYPES for op in ("add", "div")]
    + [Case(f"binary backward {op} {_shape_id(sa, sb)}[{dtype_id(t)}]",
            lambda t=t, op=op, sa=sa, sb=sb: binary_backward(t, op, sa, sb))
       for t in DTYPES for op in ew.BINARY_OPS for sa, sb in _SHAPES]
    + _dead_grad_cases()
    + _bias_cast_cases()
)
