"""Cast kernels on the emulated device, every (source, target) pair of f32, f64, f16, bf16,
int32 and int64, compared bit for bit with `cast_reference` (the exactly once-rounded value,
truncation for integer targets, computed with Fractions; NumPy's own astype to bf16 rounds
f64 and integers through f32, which is why the host SKU rounds to odd in f32 first); the
inputs include ties only a single rounding resolves, int64 beyond 2**53 included.

Sizes are small and odd (37): an aligned launch takes the 16-byte pack path and then the
scalar tail; one-element-off views (`common.place(a, True)`) take the scalar path alone.
"""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.ops.cast.plans import CAST_DTYPES
from gpuplan.ops.cast.reference import cast_reference
from gpuplan.testing import Case, check, dtype_id, f64, host, place, random, run_emulated

N = 37


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
    else:
        vals[4:6] = [1 + 2.0**-8 + 2.0**-40, -(1 + 2.0**-11 + 2.0**-40)]  # bf16 / f16 ties+
        x = vals.astype(src)
    y = place(np.full((N,), 7, dst), misaligned)
    run_emulated(gp.CastPlan, gp.CastDescriptor(N, src, dst),
                 gp.CastArgs(place(x, misaligned), y))
    got = np.ascontiguousarray(host(y))
    expect = cast_reference(x, dst)
    if dst.kind == "i":  # truncation toward zero: exact
        np.testing.assert_array_equal(got, expect, err_msg=f"cast {src}->{dst}")
        return
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
