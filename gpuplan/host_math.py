"""Vectorised special functions for the NumPy host SKUs (NumPy has no erf).

`erf` (float64 accuracy) follows W. J. Cody, "Rational Chebyshev approximations for the
error function", Math. Comp. 23 (1969) 631-637 (the coefficient sets of SPECFUN's CALERF),
in three ranges of y = |x|:

    y <= 0.46875:       erf(x)  = x * P1(y^2) / Q1(y^2)
    0.46875 < y <= 4:   erfc(y) = exp(-y^2) * P2(y) / Q2(y)
    y > 4:              erfc(y) = exp(-y^2) / y * (1/sqrt(pi) - z * P3(z) / Q3(z)),  z = 1/y^2

and erf(x) = sign(x) * (1 - erfc(y)) above the first range. Each range is evaluated only on
its own elements (gathered with take/put: boolean-mask indexing is several times slower).
Relative error against the C library's erf: a few units in the last place.

`erf_float32` is for callers whose result is rounded to float32 or coarser (the f32, f16 and
bf16 SKUs): one rational over |x| <= 4 and no range split, about twice as fast:

    erf(x) = t * P(t^2) / Q(t^2),  t = clip(x, -4, 4),  deg P = 6, deg Q = 5,

evaluated in float64. Its coefficients were fitted for this module by linearised least
squares on 40,000 Chebyshev nodes of [0, 4], reweighted (Lawson) towards the minimax
relative error: 2.1e-9 on |x| <= 4; beyond, erf(4) = 1 - 1.5e-8 stands in for +-1. Both
are below half a float32 ulp (3e-8 near 1): rounded to float32, the result is erf's correctly
rounded value or (near a tie) its neighbour.

`normal_cdf_f32` is the same rational in float32 arithmetic, for the f32 GELU: written into
caller-given buffers (a cache-sized block at a time), so that a GELU runs as ~25 float32
passes over L2-resident data instead of ~40 float64 passes over the whole array:

    Phi(x) = 1/2 + 1/2 erf(x / sqrt 2) = 1/2 + c * P'(c^2) / Q'(c^2),  c = clip(x, +-5.7),

P' and Q' being P and Q rescaled to c^2 = 2 t^2 (Q' monic), the result clipped to [0, 1].
Float32 rounding adds a few units of 2^-24 to the rational's own 2e-9: the absolute error of
Phi is below 3e-7 (2.5 ulps of 1; the float32 formula 0.5 * (1 + erf) with a correctly
rounded erf has 1e-7). The clip point (t = 4.03) is one where the float32 evaluation gives
exactly 0 and 1, so Phi is exactly 0 below -5.7 and 1 above 5.7 (the true tails are < 6e-9).
"""

from __future__ import annotations

import numpy as np

# Polynomial coefficients, highest power first (Horner order).
_P1 = (1.85777706184603153e-1, 3.16112374387056560e00, 1.13864154151050156e02,
       3.77485237685302021e02, 3.20937758913846947e03)
_Q1 = (1.0, 2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
       2.84423683343917062e03)
_P2 = (2.15311535474403846e-8, 5.64188496988670089e-1, 8.88314979438837594e00,
       6.61191906371416295e01, 2.98635138197400131e02, 8.81952221241769090e02,
       1.71204761263407058e03, 2.05107837782607147e03, 1.23033935479799725e03)
_Q2 = (1.0, 1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
       1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
       3.43936767414372164e03, 1.23033935480374942e03)
_P3 = (1.63153871373020978e-2, 3.05326634961232344e-1, 3.60344899949804439e-1,
       1.25781726111229246e-1, 1.60837851487422766e-2, 6.58749161529837803e-4)
_Q3 = (1.0, 2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1,
       6.05183413124413191e-2, 2.33520497626869185e-3)
_INV_SQRT_PI = 5.6418958354775628695e-1
_P32 = (-1.3202133588711045e-08, 4.684758671997018e-06, 3.796081030599138e-04,
        3.849607741874853e-03, 5.431688995259021e-02, 1.852031800914477e-01,
        1.1283791693756506)
_Q32 = (6.311039766627629e-05, 1.307568063479866e-03, 1.5462079527896423e-02,
        1.1395838489070141e-01, 4.9746545870035574e-01, 1.0)
_CLIP32 = 4.0
_SMALL, _MID = 0.46875, 4.0
#: erfc(6) < 2.2e-17 is below half an ulp of 1: erf is exactly +-1 from here on.
_SATURATE = 6.0


def _horner(t: np.ndarray, coefs: tuple[float, ...], out: np.ndarray) -> np.ndarray:
    """out = polynomial(t), coefficients highest power first, evaluated in place."""
    np.multiply(t, coefs[0], out=out)
    for c in coefs[1:-1]:
        out += c
        out *= t
    out += coefs[-1]
    return out


def _rational(t: np.ndarray, p: tuple[float, ...], q: tuple[float, ...]) -> np.ndarray:
    num = _horner(t, p, np.empty_like(t))
    num /= _horner(t, q, np.empty_like(t))
    return num


def _erf_small(x: np.ndarray) -> np.ndarray:
    """erf(x) for |x| <= 0.46875."""
    r = _rational(x * x, _P1, _Q1)
    r *= x
    return r


def _erfc_mid(y: np.ndarray) -> np.ndarray:
    """erfc(y) for 0.46875 < y <= 4 (y is overwritten)."""
    r = _rational(y, _P2, _Q2)
    np.multiply(y, y, out=y)
    np.negative(y, out=y)
    np.exp(y, out=y)
    r *= y
    return r


def _erfc_tail(y: np.ndarray) -> np.ndarray:
    """erfc(y) for 4 < y <= 6 (and NaN)."""
    z = y * y
    e = np.exp(-z)
    np.reciprocal(z, out=z)
    r = _rational(z, _P3, _Q3)
    r *= z
    np.subtract(_INV_SQRT_PI, r, out=r)
    r /= y
    r *= e
    return r


def _erfc_large(y: np.ndarray) -> np.ndarray:
    """erfc(y) for y > 0.46875 or NaN (y is overwritten)."""
    tail = np.flatnonzero(~(y <= _MID))  # > 4, inf and NaN
    if tail.size == 0:
        return _erfc_mid(y)
    yt = np.minimum(y.take(tail), _SATURATE)  # NaN stays NaN
    y.put(tail, _MID)
    r = _erfc_mid(y)
    r.put(tail, _erfc_tail(yt))
    return r


def erf(x: np.ndarray) -> np.ndarray:
    """Elementwise error function of any real array, as a new float64 array of its shape.

    erf(+-0) = +-0, erf(+-inf) = +-1, erf(nan) = nan; relative error a few ulps.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x.copy()
    flat = x.reshape(-1)
    y = np.abs(flat)
    small = y <= _SMALL
    i_small = np.flatnonzero(small)
    out = np.empty_like(flat)
    with np.errstate(all="ignore"):
        if i_small.size:
            out.put(i_small, _erf_small(flat.take(i_small)))
        if i_small.size < flat.size:
            i_large = np.flatnonzero(np.logical_not(small, out=small))
            r = _erfc_large(y.take(i_large))
            np.subtract(1.0, r, out=r)
            np.copysign(r, flat.take(i_large), out=r)
            out.put(i_large, r)
    return out.reshape(x.shape)


def erf_float32(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """erf(scale * x) to float32 accuracy (relative error < 3e-9 where |scale * x| <= 4,
    < 2e-8 beyond), as a new float64 array of x's shape; scale * x is formed in float64.
    erf(+-0) = +-0, erf(+-inf) ~ +-1, erf(nan) = nan."""
    t = np.multiply(x, np.float64(scale), dtype=np.float64)  # a private float64 copy
    np.clip(t, -_CLIP32, _CLIP32, out=t)  # NaN stays NaN
    z = t * t
    r = _rational(z, _P32, _Q32)
    r *= t
    return r


def _phi_coefficients() -> tuple[tuple, tuple]:
    """P32 and Q32 rescaled from t^2 to x^2 = 2 t^2, the factor 1/2 * 1/sqrt(2) folded into
    P, divided by Q's leading coefficient (monic Q: one pass less); float32, highest first."""
    p = [c / 2.0 ** k for k, c in enumerate(reversed(_P32))]
    q = [c / 2.0 ** k for k, c in enumerate(reversed(_Q32))]
    lead = q[-1]
    p = [c * 0.5 / np.sqrt(2.0) / lead for c in p]
    q = [c / lead for c in q]
    return (tuple(np.float32(c) for c in reversed(p)),
            tuple(np.float32(c) for c in reversed(q[:-1])))


#: normal_cdf_f32's constants (also the compiled kernels', gpuplan.host_kernels): P' and Q'
#: (float32, highest power first, Q' monic without its leading 1) and the clip point.
PHI_P, PHI_Q = _phi_coefficients()
PHI_CLIP = np.float32(5.7)
_ZERO32, _ONE32, _HALF32 = np.float32(0), np.float32(1), np.float32(0.5)


def normal_cdf_f32(x: np.ndarray, out: np.ndarray, s1: np.ndarray, s2: np.ndarray
                   ) -> np.ndarray:
    """out = Phi(x) = (1 + erf(x / sqrt 2)) / 2 in float32 arithmetic (absolute error < 3e-7,
    0 <= Phi <= 1; Phi(-inf) = 0, Phi(inf) = 1, Phi(nan) = nan). x, out and the scratch s1, s2
    are float32 arrays of one shape; out, s1, s2 are overwritten (out may not be x). Returns
    out."""
    np.clip(x, -PHI_CLIP, PHI_CLIP, out=s1)  # c (NaN stays NaN)
    np.multiply(s1, s1, out=s2)                  # u = c^2
    p, q = PHI_P, PHI_Q
    np.multiply(s2, p[0], out=out)
    for coef in p[1:-1]:
        out += coef
        out *= s2
    out += p[-1]                                  # P(u)
    s1 *= out                                     # c P(u)
    np.add(s2, q[0], out=out)
    for coef in q[1:]:
        out *= s2
        out += coef                               # Q(u), monic
    np.divide(s1, out, out=out)
    out += _HALF32
    return np.clip(out, _ZERO32, _ONE32, out=out)
