"""Compiled float32 host kernels (numba): GELU, the LayerNorm/RMSNorm rows and AdamW in one
pass each, and the host threads' polling wait.

NumPy runs an element-wise op as one pass per ufunc (the float32 GELU forward is ~25 passes,
a LayerNorm row block ~10), and every pass reads and writes memory. These kernels make one
pass over their operands, compiled to vector code by numba (LLVM). Import this module
through `gpuplan.host_jit.kernels()`, which loads it on first use (never at
``import gpuplan``) and falls back to the NumPy passes where numba is missing.

Every kernel works on the part of the operands its caller gives it (contiguous float32
arrays), releases the GIL (``nogil``), and is split over the host threads by
gpuplan.host_pool, which owns the thread budget: there is no numba thread pool. Results do
not depend on the split: element-wise maps, each row's sums in a fixed order, and
parameter-gradient partial sums per caller-given block of rows. No fast-math: the float
semantics are IEEE's, so a kernel's bits are those of the same operations in NumPy.

GELU: Phi is gpuplan.host_math.normal_cdf_f32's rational, the same float32 operations in the
same order, so the forward gives the NumPy block math's bits. The gradient's exp(-x^2 / 2)
is `_exp_f32` (float64 arithmetic rounded once: within an ulp of the true value; NumPy's
float32 exp also errs by up to an ulp, so a few gradients differ from the NumPy path's by
one ulp).

LayerNorm (RMSNorm: rms=True, mean 0) of float32 rows: each row's statistics and gradient
projections are float64 sums of eight interleaved partial sums added in a fixed order; y and
dx are computed in float64 and rounded once. mean and rstd are saved rounded to float32. The
eps given is float32(eps), as in the NumPy path.

Column sums (the host reduce over leading axes, e.g. a bias gradient): float32 sums row by
row, NumPy's order for a float32 sum over axis 0 (same bits as the NumPy path).

AdamW: the NumPy path's float32 operations in order (same bits). `wait_until`: polls a flag
with the GIL released, for gpuplan.host_pool's workers (not cached: it calls libc through
ctypes).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np
from numba import njit, types

from gpuplan.host_math import PHI_CLIP, PHI_P, PHI_Q

#: Every kernel: no GIL, cached compiled code, IEEE float division (x / 0 = inf, not
#: ZeroDivisionError).
_OPTIONS = dict(nogil=True, cache=True, error_model="numpy")
_INLINE = dict(_OPTIONS, inline="always")
#: Argument types: C-contiguous float32 vectors and [rows, n] arrays, read-only for inputs
#: (writable arrays convert to these; a read-only input would match no writable type).
_F32, _F64, _BOOL = types.float32, types.float64, types.boolean
_VEC, _ROWS = types.float32[::1], types.float32[:, ::1]
_IN_VEC = types.Array(_F32, 1, "C", readonly=True)
_IN_ROWS = types.Array(_F32, 2, "C", readonly=True)
_F64_VEC = types.float64[::1]

_P0, _P1, _P2, _P3, _P4, _P5, _P6 = PHI_P
_Q0, _Q1, _Q2, _Q3, _Q4 = PHI_Q
_CLIP = PHI_CLIP
_ZERO, _HALF, _ONE = np.float32(0), np.float32(0.5), np.float32(1)
_MINUS_HALF = np.float32(-0.5)
_INV_SQRT_2PI = np.float32(0.39894228040143267794)

_LOG2E, _LN2 = 1.4426950408889634, 0.6931471805599453
# exp(r) = sum_k r^k / k! to degree 8 on |r| <= ln2 / 2: truncation error < 2e-10.
_E8, _E7, _E6, _E5 = 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120
_E4, _E3, _E2 = 1.0 / 24, 1.0 / 6, 0.5


@njit("float32(float32)", **_INLINE)
def _phi(x):
    """Phi(x) = (1 + erf(x / sqrt 2)) / 2: host_math.normal_cdf_f32, one element."""
    c = _CLIP if x > _CLIP else x  # NaN stays NaN
    c = -_CLIP if c < -_CLIP else c
    u = c * c
    p = u * _P0
    p += _P1
    p *= u
    p += _P2
    p *= u
    p += _P3
    p *= u
    p += _P4
    p *= u
    p += _P5
    p *= u
    p += _P6
    num = c * p
    q = u + _Q0
    q *= u
    q += _Q1
    q *= u
    q += _Q2
    q *= u
    q += _Q3
    q *= u
    q += _Q4
    o = num / q
    o += _HALF
    o = _ONE if o > _ONE else o
    return _ZERO if o < _ZERO else o


@njit("float32(float32)", **_INLINE)
def _exp_f32(s):
    """exp(s) in float64 arithmetic, rounded to float32 (a libm call would not vectorize):
    s = k ln2 + r, exp(r) by its Taylor polynomial, 2^k from the exponent bits. s is clamped
    to [-200, 100], beyond float32's range either way; NaN gives NaN."""
    t = np.float64(s)
    t = 100.0 if t > 100.0 else t
    t = -200.0 if t < -200.0 else t
    k = math.floor((t if t == t else 0.0) * _LOG2E + 0.5)  # NaN must not reach the int
    r = t - k * _LN2
    p = _E8 * r + _E7
    p = p * r + _E6
    p = p * r + _E5
    p = p * r + _E4
    p = p * r + _E3
    p = p * r + _E2
    p = p * r + 1.0
    p = p * r + 1.0
    two_k = np.int64((np.int64(k) + 1023) << 52).view(np.float64)
    return np.float32(p * two_k)


@njit("float32(float32)", **_INLINE)
def _x_pdf(x):
    """x phi(x) = x exp(-x^2 / 2) / sqrt(2 pi), float32 steps as in the NumPy path."""
    s = x * x
    s *= _MINUS_HALF
    s = _exp_f32(s)
    s *= x
    return s * _INV_SQRT_2PI


@njit(types.void(_IN_VEC, _VEC), **_OPTIONS)
def gelu_forward(x, y):
    """y = x Phi(x)."""
    for i in range(x.size):
        y[i] = _phi(x[i]) * x[i]


@njit(types.void(_ROWS, _IN_VEC, _BOOL, _ROWS), **_OPTIONS)
def bias_gelu_forward(p, bias, has_bias, y):
    """p += bias (p, y [rows, n]; bias [n] when has_bias), y = GELU(p): the host GEMM
    epilogue after BLAS wrote the pre-activation p."""
    rows, n = p.shape
    for r in range(rows):
        pr, yr = p[r], y[r]
        if has_bias:
            for j in range(n):
                v = pr[j] + bias[j]
                pr[j] = v
                yr[j] = _phi(v) * v
        else:
            for j in range(n):
                v = pr[j]
                yr[j] = _phi(v) * v


@njit(types.void(_IN_VEC, _IN_VEC, _VEC), **_OPTIONS)
def gelu_backward(x, dy, dx):
    """dx = dy (Phi(x) + x phi(x))."""
    for i in range(x.size):
        g = _phi(x[i])
        g += _x_pdf(x[i])
        dx[i] = g * dy[i]


@njit(types.void(_IN_VEC, _IN_VEC, _IN_VEC, _VEC), **_OPTIONS)
def gelu_backward_y(x, dy, y, dx):
    """dx = dy (Phi(x) + x phi(x)) with Phi(x) = y / x from the forward's y (1/2 at x = 0)."""
    for i in range(x.size):
        xi = x[i]
        g = y[i] / xi
        g = _HALF if xi == _ZERO else g
        g += _x_pdf(xi)
        dx[i] = g * dy[i]


@njit(**_INLINE)  # typed by its callers: float64 rows here, float32 ones for attention
def _sum(a, n):
    """a[0] + ... + a[n-1] in float64: eight interleaved partial sums, added pairwise, then
    the tail."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    m = n - n % 8
    for i in range(0, m, 8):
        s0 += a[i]
        s1 += a[i + 1]
        s2 += a[i + 2]
        s3 += a[i + 3]
        s4 += a[i + 4]
        s5 += a[i + 5]
        s6 += a[i + 6]
        s7 += a[i + 7]
    s = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
    for i in range(m, n):
        s += a[i]
    return s


@njit("float64(float64[::1], float64[::1], int64)", **_INLINE)
def _dot(a, b, n):
    """a[0] b[0] + ... + a[n-1] b[n-1], summed as `_sum` does."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    m = n - n % 8
    for i in range(0, m, 8):
        s0 += a[i] * b[i]
        s1 += a[i + 1] * b[i + 1]
        s2 += a[i + 2] * b[i + 2]
        s3 += a[i + 3] * b[i + 3]
        s4 += a[i + 4] * b[i + 4]
        s5 += a[i + 5] * b[i + 5]
        s6 += a[i + 6] * b[i + 6]
        s7 += a[i + 7] * b[i + 7]
    s = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
    for i in range(m, n):
        s += a[i] * b[i]
    return s


@njit(types.void(_IN_ROWS, _IN_ROWS, _ROWS, _IN_VEC, _IN_VEC, _ROWS, _VEC, _VEC, _F64, _BOOL,
                 _BOOL, _BOOL, _BOOL), **_OPTIONS)
def norm_forward(x, residual, s, weight, bias, y, mean, rstd, eps, has_residual, rms,
                 has_weight, has_bias):
    """Rows of x [rows, dim] (s = x + residual, written, when has_residual: the rows are then
    those of s): mean (not written when rms), rstd = 1 / sqrt(var + eps) and
    y = (x - mean) rstd weight + bias."""
    rows, dim = x.shape
    inv = 1.0 / dim if dim else 0.0
    c = np.empty(dim, np.float64)
    for r in range(rows):
        xr = x[r]
        if has_residual:
            rr, sr = residual[r], s[r]
            for j in range(dim):
                v = xr[j] + rr[j]  # float32, as the binary add plan rounds it
                sr[j] = v
                c[j] = v
        else:
            for j in range(dim):
                c[j] = xr[j]
        m = 0.0
        if not rms:
            m = _sum(c, dim) * inv
            for j in range(dim):
                c[j] -= m
        rs = 1.0 / math.sqrt(_dot(c, c, dim) * inv + eps)
        yr = y[r]
        if has_weight and has_bias:
            for j in range(dim):
                yr[j] = c[j] * rs * weight[j] + bias[j]
        elif has_weight:
            for j in range(dim):
                yr[j] = c[j] * rs * weight[j]
        elif has_bias:
            for j in range(dim):
                yr[j] = c[j] * rs + bias[j]
        else:
            for j in range(dim):
                yr[j] = c[j] * rs
        if not rms:
            mean[r] = m
        rstd[r] = rs


@njit(types.void(_IN_ROWS, _IN_ROWS, _IN_VEC, _IN_VEC, _IN_VEC, _IN_ROWS, _ROWS, _F64_VEC,
                 _F64_VEC, _BOOL, _BOOL, _BOOL, _BOOL, _BOOL), **_OPTIONS)
def norm_backward(dy, x, weight, mean, rstd, ds, dx, part_w, part_b, rms, has_weight, has_ds,
                  want_w, want_b):
    """Rows of the norm's gradient: with xhat = (x - mean) rstd and g = dy weight,
    dx = rstd (g - mean_d(g) - xhat mean_d(g xhat)) (no mean_d(g) term when rms), rounded to
    float32, then + ds when has_ds (a float32 add, as the binary add plan's); part_w += dy xhat
    and part_b += dy, summed over these rows in order, when asked."""
    rows, dim = x.shape
    inv = 1.0 / dim if dim else 0.0
    xhat = np.empty(dim, np.float64)
    g = np.empty(dim, np.float64)
    for r in range(rows):
        xr, dyr, dxr = x[r], dy[r], dx[r]
        m = 0.0 if rms else np.float64(mean[r])
        rs = np.float64(rstd[r])
        for j in range(dim):
            xhat[j] = (xr[j] - m) * rs
        if has_weight:
            for j in range(dim):
                g[j] = dyr[j] * np.float64(weight[j])
        else:
            for j in range(dim):
                g[j] = dyr[j]
        if want_w:
            for j in range(dim):
                part_w[j] += dyr[j] * xhat[j]
        if want_b:
            for j in range(dim):
                part_b[j] += dyr[j]
        a = 0.0 if rms else _sum(g, dim) * inv
        p = _dot(g, xhat, dim) * inv
        if has_ds:
            dsr = ds[r]
            for j in range(dim):
                dxr[j] = np.float32(rs * (g[j] - a - xhat[j] * p)) + dsr[j]
        else:
            for j in range(dim):
                dxr[j] = rs * (g[j] - a - xhat[j] * p)


@njit(types.void(_IN_ROWS, _VEC, types.intp, types.intp), **_OPTIONS)
def column_sums(x, acc, lo, hi):
    """acc[lo:hi] += x[r, lo:hi] for r = 0, 1, ... in order, in float32: from acc = 0, each
    column's sum as NumPy's float32 sum over axis 0 adds it (row by row, same bits)."""
    out, n, rows = acc[lo:hi], hi - lo, x.shape[0]
    top = rows - rows % 4
    for r in range(0, top, 4):  # four rows per pass over out, added in row order
        r0, r1, r2, r3 = x[r, lo:hi], x[r + 1, lo:hi], x[r + 2, lo:hi], x[r + 3, lo:hi]
        for j in range(n):  # from 0: no negative-index wrap, so the loop vectorizes
            out[j] = (((out[j] + r0[j]) + r1[j]) + r2[j]) + r3[j]
    for r in range(top, rows):
        row = x[r, lo:hi]
        for j in range(n):
            out[j] += row[j]


@njit(types.void(_VEC, _IN_VEC, _VEC, _VEC, *[_F32] * 8), **_OPTIONS)
def adamw(p, g, m, v, decay, b1, omb1, b2, omb2, step_size, inv_sqrt_bc2, eps):
    """One AdamW step in place, the float32 roundings of gpuplan.ops.adamw_host's NumPy passes
    in their order: m = b1 m + omb1 g, v = b2 v + omb2 g g,
    p = p decay - step_size m / (sqrt(v) inv_sqrt_bc2 + eps)."""
    for i in range(p.size):
        gi = g[i]
        mi = m[i] * b1 + gi * omb1
        vi = v[i] * b2 + gi * gi * omb2
        m[i] = mi
        v[i] = vi
        den = math.sqrt(vi) * inv_sqrt_bc2 + eps
        p[i] = p[i] * decay - mi / den * step_size


def _sched_yield() -> Any:
    """libc's sched_yield as a ctypes function numba can call, or None (not Linux/glibc)."""
    try:
        fn = ctypes.CDLL(None).sched_yield
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    return fn


_YIELD = _sched_yield()
if _YIELD is not None:
    # Not cached (numba cannot cache a function holding a ctypes pointer): ~0.1 s to compile
    # once per process.
    @njit(types.boolean(types.int64[::1], types.intp, types.int64, types.int64, types.int64),
          nogil=True)
    def wait_until(flags, index, value, polls, settle):
        """Whether flags[index] == value within `polls` polls, yielding the CPU between polls
        (the opaque call also makes every poll reload flags[index]); once it is, `settle`
        more yields before returning. The GIL is released meanwhile."""
        for _ in range(polls):
            if flags[index] == value:
                for _ in range(settle):
                    _YIELD()
                return True
            _YIELD()
        return flags[index] == value
else:
    wait_until = None
