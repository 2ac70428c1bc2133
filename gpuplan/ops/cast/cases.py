"""Cast kernels on the emulated device, every (source, target) pair of f32, f64, f16, bf16,
int32 and int64. Floats are compared bit for bit with the exactly once-rounded value
(truncation for integer targets), computed with Fractions (an independent reference;
NumPy's own astype to bf16 rounds f64 and integers through f32, which is why the host SKU
rounds to odd in f32 first), and the inputs include ties only a single rounding resolves,
int64 beyond 2**53 included.

Sizes are small and odd (37): an aligned launch takes the 16-byte pack path and then the
scalar tail; one-element-off views (`common.place(a, True)`) take the scalar path alone.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import bfloat16, float16
from gpuplan.ops.cast.plans import CAST_DTYPES
from gpuplan.testing import Case, check, dtype_id, f64, host, place, random, run_emulated

N = 37


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
    y = place(np.full((N,), 7, dst), misaligned)
    run_emulated(gp.CastPlan, gp.CastDescriptor(N, src, dst),
                 gp.CastArgs(place(x, misaligned), y))
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


CASES = (
    [Case(f"cast {dtype_id(s)}->{dtype_id(d)}", lambda s=s, d=d: cast(s, d))
     for s in CAST_DTYPES for d in CAST_DTYPES]
    # a third of the pairs also through the scalar path
    + [Case(f"cast misaligned {dtype_id(s)}->{dtype_id(d)}", lambda s=s, d=d: cast(s, d, True))
       for i, s in enumerate(CAST_DTYPES) for j, d in enumerate(CAST_DTYPES) if (i + j) % 3 == 0]
)
