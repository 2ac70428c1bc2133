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
not depend on the split: element-wise maps, each row's sums within one call, and
parameter-gradient partial sums per caller-given block of rows. No fast-math, except one
flag on the LayerNorm row sums (below): elsewhere the float semantics are IEEE's, so a
kernel's bits are those of the same operations in NumPy.

GELU: Phi is gpuplan.host_math.normal_cdf_f32's rational, the same float32 operations in the
same order, so the forward gives the NumPy block math's bits. The gradient's exp(-x^2 / 2)
is `_exp_f32` (float64 arithmetic rounded once: within an ulp of the true value; NumPy's
float32 exp also errs by up to an ulp, so a few gradients differ from the NumPy path's by
one ulp).

LayerNorm (RMSNorm: rms=True, mean 0) of float32 rows, in float32 as the NumPy path and
PyTorch's CPU kernel compute them: mean, then the variance as the mean of (x - mean)^2 (two
passes, no cancellation), y = (x - mean) rstd weight + bias; dx from the row sums of g and
g (x - mean). The row sums may be reassociated (fastmath "reassoc" on `_row_sum`,
`_row_sq_dev` and `_row_grad_sums` only), which lets LLVM sum in vector partial sums: ~3x
faster than fixed-order scalar sums ([1024, 128] forward 100 -> 42 us, backward 142 -> 76 us
on one thread). The order is then the compiled code's: the same for every call and thread
split on a machine, not across vector widths (AVX2 / AVX-512), and not the NumPy path's
(both stay within float32 rounding of the float64 reference, which the tests check). The
weight and bias gradients' partial sums over a block's rows are float64, in row order. The
eps given is float32(eps), as in the NumPy path.

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
#: The LayerNorm row sums only: LLVM may reassociate their float32 additions (vector partial
#: sums); no other fast-math flag, and on no other operation.
_REASSOC = dict(_OPTIONS, fastmath={"reassoc"})
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


@njit(**_INLINE)  # typed by its callers (float32 rows of gpuplan.host_kernels_attention)
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


# -- LayerNorm / RMSNorm rows: float32 math; the row sums reassociated into vector partial
# sums (fastmath reassoc on the sum helpers only, their flags kept when LLVM inlines them).

@njit(**_REASSOC)
def _row_sum(a, r):
    """a[r, 0] + ... + a[r, n-1] in float32, in the compiler's vector order. (Rows are passed
    as (array, index): a row view handed to a function not inlined costs reference counts.)"""
    s = _ZERO
    for j in range(a.shape[1]):
        s += a[r, j]
    return s


@njit(**_REASSOC)
def _row_sq_dev(a, r, m):
    """sum over j of (a[r, j] - m)^2 in float32, in the compiler's vector order."""
    q = _ZERO
    for j in range(a.shape[1]):
        d = a[r, j] - m
        q += d * d
    return q


@njit(**_REASSOC)
def _row_grad_sums(dy, w, x, r, m, has_weight):
    """(sum of g, sum of g (x - m)) over row r, g = dy w (dy when not has_weight), float32,
    in the compiler's vector order."""
    sg = sgx = _ZERO
    if has_weight:
        for j in range(x.shape[1]):
            g = dy[r, j] * w[j]
            sg += g
            sgx += g * (x[r, j] - m)
    else:
        for j in range(x.shape[1]):
            g = dy[r, j]
            sg += g
            sgx += g * (x[r, j] - m)
    return sg, sgx


@njit(**_INLINE)
def _norm_row(v, r, y, weight, bias, inv, eps, rms, has_weight, has_bias):
    """y[r] = (v[r] - m) rs weight + bias; returns (m, rs), m = 0 when rms."""
    m = _ZERO if rms else _row_sum(v, r) * inv
    rs = _ONE / np.sqrt(_row_sq_dev(v, r, m) * inv + eps)
    n = v.shape[1]
    if has_weight and has_bias:
        for j in range(n):
            y[r, j] = (v[r, j] - m) * rs * weight[j] + bias[j]
    elif has_weight:
        for j in range(n):
            y[r, j] = (v[r, j] - m) * rs * weight[j]
    elif has_bias:
        for j in range(n):
            y[r, j] = (v[r, j] - m) * rs + bias[j]
    else:
        for j in range(n):
            y[r, j] = (v[r, j] - m) * rs
    return m, rs


@njit(types.void(_IN_ROWS, _IN_ROWS, _ROWS, _IN_VEC, _IN_VEC, _ROWS, _VEC, _VEC, _F64, _BOOL,
                 _BOOL, _BOOL, _BOOL), **_OPTIONS)
def norm_forward(x, residual, s, weight, bias, y, mean, rstd, eps, has_residual, rms,
                 has_weight, has_bias):
    """Rows of x [rows, dim] (s = x + residual, written, when has_residual: the rows are then
    those of s): mean (not written when rms), rstd = 1 / sqrt(var + eps) and
    y = (x - mean) rstd weight + bias, in float32 (var: the mean of (x - mean)^2)."""
    rows, dim = x.shape
    inv = np.float32(1.0 / dim if dim else 0.0)
    eps32 = np.float32(eps)
    for r in range(rows):
        if has_residual:
            for j in range(dim):
                s[r, j] = x[r, j] + residual[r, j]  # float32, as the binary add plan rounds it
            m, rs = _norm_row(s, r, y, weight, bias, inv, eps32, rms, has_weight, has_bias)
        else:
            m, rs = _norm_row(x, r, y, weight, bias, inv, eps32, rms, has_weight, has_bias)
        if not rms:
            mean[r] = m
        rstd[r] = rs


@njit(types.void(_IN_ROWS, _IN_ROWS, _IN_VEC, _IN_VEC, _IN_VEC, _IN_ROWS, _ROWS, _F64_VEC,
                 _F64_VEC, _BOOL, _BOOL, _BOOL, _BOOL, _BOOL), **_OPTIONS)
def norm_backward(dy, x, weight, mean, rstd, ds, dx, part_w, part_b, rms, has_weight, has_ds,
                  want_w, want_b):
    """Rows of the norm's gradient, in float32: with xhat = (x - mean) rstd and g = dy weight,
    dx = rstd (g - mean_d(g) - xhat mean_d(g xhat)) (no mean_d(g) term when rms), then + ds
    when has_ds (a float32 add, as the binary add plan's); part_w += dy xhat and
    part_b += dy in float64, summed over these rows in order, when asked."""
    rows, dim = x.shape
    inv = np.float32(1.0 / dim if dim else 0.0)
    for r in range(rows):
        m = _ZERO if rms else mean[r]
        rs = rstd[r]
        sg, sgx = _row_grad_sums(dy, weight, x, r, m, has_weight)
        a = _ZERO if rms else sg * inv
        p = sgx * rs * inv  # mean_d(g xhat)
        for j in range(dim):  # one pass; LLVM unswitches the invariant branches
            d = dy[r, j]
            xhat = (x[r, j] - m) * rs
            g = d * weight[j] if has_weight else d
            v = rs * (g - a - xhat * p)
            dx[r, j] = v + ds[r, j] if has_ds else v
            if want_w:
                part_w[j] += np.float64(d) * xhat
            if want_b:
                part_b[j] += d


@njit(types.void(_VEC, _IN_VEC, _VEC, _VEC, *[_F32] * 8), **_OPTIONS)
def adamw(p, g, m, v, decay, b1, omb1, b2, omb2, step_size, inv_sqrt_bc2, eps):
    """One AdamW step in place, the float32 roundings of gpuplan.ops.optimizer.adamw_host's
    NumPy passes in their order: m = b1 m + omb1 g, v = b2 v + omb2 g g,
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
        (the opaque call also makes every poll reload flags[index]); once it is,
        flags[settle] more yields before returning (read then: the poster sets it before
        the flag). The GIL is released meanwhile."""
        for _ in range(polls):
            if flags[index] == value:
                for _ in range(flags[settle]):
                    _YIELD()
                return True
            _YIELD()
        return flags[index] == value
else:
    wait_until = None
