"""Compiled host kernels (numba) of the softmax family for small float32 / float64 inputs:
one call does every row, forward or backward, softmax or log-softmax, scaled and causal.

The NumPy path (gpuplan.ops.softmax.plans) makes about ten NumPy calls over a block of rows
(scale, max, the fully-masked fix, subtract, exp, sum, divide, copy out): on an 8x8 input
their fixed costs are most of the op. These kernels make one call, so the plans use them
for inputs of up to SMALL elements (gpuplan.ops.softmax.plans) when gpuplan.host_jit has
numba; larger inputs keep the NumPy passes, whose float32 exp is vectorized. Loaded through
`gpuplan.host_jit.extra("ops.softmax.host_kernels")`; the GIL is released.

Arithmetic (per row, over its unmasked positions j < limit): z = scale * x, its maximum m
(NaN when a z is NaN; 0 when the row has no finite maximum: its z are all -inf or it is
fully masked, as in the NumPy path), exp(z - m), the row sum and the quotient (log-softmax:
(z - m) - log(sum)) all in float64, rounded once to the data dtype: within half an ulp or so
of the float64 reference for float32 rows, float64's own rounding for float64 rows (the
NumPy path rounds z, z - m and exp to float32 on the way). Masked positions are written 0
(log-softmax: -inf). Special rows give what the NumPy path gives: a NaN or +inf in a row
makes its unmasked outputs NaN, a row whose unmasked z are all -inf gives NaN there, a
fully masked row is all 0 (log: -inf).

Backward from the forward output y (sums over the unmasked positions; masked dx = 0):
softmax dx = scale * y * (dy - sum dy * y), log-softmax dx = scale * (dy - exp(y) * sum dy),
in float64, rounded once.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types

_OPTIONS = dict(nogil=True, cache=True, error_model="numpy")


def _sig(dt: types.Type, n_in: int) -> types.Type:
    """void(n_in read-only [rows, dim] inputs, one [rows, dim] output, scale, q_len, log)."""
    rows_in = types.Array(dt, 2, "C", readonly=True)
    return types.void(*([rows_in] * n_in), dt[:, ::1], types.float64, types.int64,
                      types.boolean)


_SIGS_FORWARD = [_sig(types.float32, 1), _sig(types.float64, 1)]
_SIGS_BACKWARD = [_sig(types.float32, 2), _sig(types.float64, 2)]


@njit("int64(int64, int64, int64)", inline="always", **_OPTIONS)
def _limit(r, dim, q_len):
    """Unmasked positions of row r: all `dim` (q_len 0: not causal), else those of query
    i = r % q_len, j <= i + dim - q_len (at least 0, at most dim)."""
    if q_len == 0:
        return dim
    n = r % q_len + dim - q_len + 1
    n = dim if n > dim else n
    return 0 if n < 0 else n


@njit(_SIGS_FORWARD, **_OPTIONS)
def softmax_forward(x, y, scale, q_len, log):
    """y = (log-)softmax(scale * x) of each row of x [rows, dim]; causal when q_len > 0."""
    rows, dim = x.shape
    fill = -np.inf if log else 0.0
    z = np.empty(dim)  # the row's scale * x, then exp(z - m), in float64
    for r in range(rows):
        n = _limit(r, dim, q_len)
        m = -np.inf
        nan = False
        for j in range(n):
            v = x[r, j] * scale
            z[j] = v
            if v > m:
                m = v
            elif v != v:
                nan = True
        if nan:
            m = np.nan
        elif m == -np.inf:
            m = 0.0
        s = 0.0
        if log:
            for j in range(n):
                s += math.exp(z[j] - m)
            ls = math.log(s)
            for j in range(n):
                y[r, j] = (z[j] - m) - ls
        else:
            for j in range(n):
                e = math.exp(z[j] - m)
                z[j] = e
                s += e
            for j in range(n):
                y[r, j] = z[j] / s
        for j in range(n, dim):
            y[r, j] = fill


@njit(_SIGS_BACKWARD, **_OPTIONS)
def softmax_backward(y, dy, dx, scale, q_len, log):
    """dx of (log-)softmax(scale * x) from its output y and dy [rows, dim] (see the module
    docstring); causal when q_len > 0."""
    rows, dim = y.shape
    for r in range(rows):
        n = _limit(r, dim, q_len)
        s = 0.0
        if log:
            for j in range(n):
                s += np.float64(dy[r, j])
            for j in range(n):
                dx[r, j] = scale * (np.float64(dy[r, j]) - math.exp(np.float64(y[r, j])) * s)
        else:
            for j in range(n):
                s += np.float64(dy[r, j]) * np.float64(y[r, j])
            for j in range(n):
                dx[r, j] = scale * np.float64(y[r, j]) * (np.float64(dy[r, j]) - s)
        for j in range(n, dim):
            dx[r, j] = 0.0
