"""Exact reference of the cast family: each value converted from its exact rational value
(Fractions), floats rounded once to nearest even, integers truncated toward zero."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import as_dtype, bfloat16, float16

__all__ = ["FLOAT_FORMATS", "cast_reference", "round_once"]

#: (significand bits, min normal exponent, max exponent) of the float cast targets.
FLOAT_FORMATS = {np.dtype(np.float64): (53, -1022, 1023), np.dtype(np.float32): (24, -126, 127),
                 np.dtype(float16): (11, -14, 15), np.dtype(bfloat16): (8, -126, 127)}


def round_once(v: Fraction, dtype: Any) -> float:
    """The exact rational v rounded once to nearest even in the float format of `dtype`
    (subnormals below the min normal exponent, overflow to +-inf), as a float that the
    format represents exactly."""
    bits, emin, emax = FLOAT_FORMATS[as_dtype(dtype)]
    if v == 0:
        return 0.0
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # within one of log2(a)
    e += 1 if Fraction(2) ** e <= a / 2 else 0
    e -= 1 if Fraction(2) ** e > a else 0  # now 2**e <= a < 2**(e + 1)
    ulp = Fraction(2) ** (max(e, emin) - bits + 1)
    q, r = divmod(a, ulp)
    q += 1 if r > ulp / 2 or (r == ulp / 2 and q % 2) else 0
    out = math.inf if q * ulp >= Fraction(2) ** (emax + 1) else float(q * ulp)
    return out if v > 0 else -out


def _exact(v: Any) -> Fraction:
    return Fraction(int(v)) if isinstance(v, np.integer) else Fraction(float(v))


def cast_reference(x: Any, out_dtype: Any) -> np.ndarray:
    """x (host or device, any cast dtype) converted to `out_dtype`, returned in out_dtype (an
    exact result needs no float64 detour: int64 holds values float64 cannot). Float targets:
    the exact value rounded once to nearest even, the sign of zero kept, inf and NaN passed
    through. Integer targets: truncation toward zero; NaN, inf or a value out of the target's
    range is unspecified by the plans and raises ValueError here."""
    x = np.ascontiguousarray(gp.to_host(x))
    t = as_dtype(out_dtype)
    flat = x.reshape(-1)
    if t.kind == "i":
        info = np.iinfo(t)
        out = []
        for v in flat:
            if not np.isfinite(float(v)):
                raise ValueError(f"cast_reference: {v} to {t} is unspecified")
            r = math.trunc(_exact(v))
            if not info.min <= r <= info.max:
                raise ValueError(f"cast_reference: {v} to {t} is out of range (unspecified)")
            out.append(r)
        return np.array(out, t).reshape(x.shape)
    out64 = np.array([round_once(_exact(v), t) if np.isfinite(float(v)) else float(v)
                      for v in flat], np.float64)
    # A Fraction has no sign: -0.0 comes back from the input's sign bit.
    signed = flat < 0 if x.dtype.kind in "iu" else np.signbit(flat.astype(np.float64))
    out64 = np.where(out64 == 0, np.where(signed, -0.0, 0.0), out64)
    return out64.astype(t).reshape(x.shape)
