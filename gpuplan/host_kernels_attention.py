"""Compiled float32 host kernels (numba) of the host attention plans: the softmax of a block
of scores, and the backward's probabilities and score gradients, one pass per row each.

The host attention (gpuplan.ops.attention.host) runs its products as BLAS GEMMs over a block
of query rows and the keys they can see; between the GEMMs NumPy would make ~8 passes over
the block's scores (scale, mask, max, subtract, exp, sum, normalise; the backward as many).
These kernels make one pass per row over the row's unmasked scores, with the row still in
cache, and write the masked tail's zeros. Loaded through
`gpuplan.host_jit.extra("host_kernels_attention")`. They use gpuplan.host_kernels' float32
exp (`_exp_f32`: float64 arithmetic rounded once, within an ulp) and float64 row sum
(`_sum`); the GIL is released.

Rows: block row r of batch entry b is query i = i0 + r; key j is masked when j > i + diag
(diag = lk - lq for a causal plan, and >= the block's key count otherwise). A row every key
of which is masked, or whose unmasked scores are all -inf, has max 0, probabilities 0 and
lse -inf, as the NumPy path gives. Float32 steps in the NumPy path's order (x = s scale;
x - max; (dp - delta) p scale); sums of probabilities are float64.

Cache: numba's on-disk cache keys these kernels on this file's stamp only, not on the
host_kernels helpers they inline (`_exp_f32`, `_sum`): after editing those, touch this file
(or clear its __pycache__) so that the kernels recompile.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types

from gpuplan.host_kernels import _OPTIONS, _exp_f32, _sum

_F32, _I64, _BOOL = types.float32, types.int64, types.boolean
_BLOCK = types.float32[:, :, ::1]  # [entries, rows, keys], C order
_IN_BLOCK = types.Array(_F32, 3, "C", readonly=True)
_ROWS_ANY = types.float32[:, :]  # [entries, rows]: a view of the plan's [B, Lq] operand
_IN_ROWS_ANY = types.Array(_F32, 2, "A", readonly=True)
_ZERO = np.float32(0)
_INLINE = dict(_OPTIONS, inline="always")


@njit("int64(int64, int64, int64)", **_INLINE)
def _limit(i, diag, keys):
    """How many keys query i sees: min(keys, i + diag + 1), at least 0."""
    n = i + diag + 1
    n = keys if n > keys else n
    return 0 if n < 0 else n


@njit("float32(float32[::1], int64)", **_INLINE)
def _max(a, n):
    """max(a[:n]) (-inf for n = 0; NaNs are skipped: the exp pass propagates them), over
    eight interleaved partial maxima so that it vectorizes."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.float32(-np.inf)
    e = n - n % 8
    for i in range(0, e, 8):
        m0 = a[i] if a[i] > m0 else m0
        m1 = a[i + 1] if a[i + 1] > m1 else m1
        m2 = a[i + 2] if a[i + 2] > m2 else m2
        m3 = a[i + 3] if a[i + 3] > m3 else m3
        m4 = a[i + 4] if a[i + 4] > m4 else m4
        m5 = a[i + 5] if a[i + 5] > m5 else m5
        m6 = a[i + 6] if a[i + 6] > m6 else m6
        m7 = a[i + 7] if a[i + 7] > m7 else m7
    m0 = m1 if m1 > m0 else m0
    m2 = m3 if m3 > m2 else m2
    m4 = m5 if m5 > m4 else m4
    m6 = m7 if m7 > m6 else m6
    m0 = m2 if m2 > m0 else m0
    m4 = m6 if m6 > m4 else m4
    m0 = m4 if m4 > m0 else m0
    for i in range(e, n):
        m0 = a[i] if a[i] > m0 else m0
    return m0


@njit(types.void(_BLOCK, _F32, _I64, _I64, _ROWS_ANY), **_OPTIONS)
def softmax_block(s, scale, i0, diag, lse):
    """s [entries, rows, keys] of q k^T in place -> the probabilities
    exp(x - m) / sum exp(x - m) of x = s scale over the unmasked keys (0 on masked ones), and
    lse = m + log(sum) [entries, rows]."""
    entries, rows, keys = s.shape
    for b in range(entries):
        for r in range(rows):
            row = s[b, r]
            n = _limit(i0 + r, diag, keys)
            for j in range(n):
                row[j] *= scale
            m = _max(row, n)
            m = _ZERO if m == -np.inf else m
            for j in range(n):
                row[j] = _exp_f32(row[j] - m)
            total = _sum(row, n)
            inv = np.float32(1.0 / total) if total > 0.0 else _ZERO
            inv = np.float32(np.nan) if total != total else inv
            for j in range(n):
                row[j] *= inv
            for j in range(n, keys):
                row[j] = _ZERO
            if total != total:
                lse[b, r] = np.nan
            elif total > 0.0:
                lse[b, r] = np.float32(m + math.log(total))
            else:
                lse[b, r] = -np.inf


@njit(types.void(_BLOCK, _BLOCK, _F32, _I64, _I64, _IN_ROWS_ANY, _IN_ROWS_ANY, _IN_BLOCK,
                 _BOOL), **_OPTIONS)
def grad_scores_block(s, dp, scale, i0, diag, lse, delta, mul, has_mul):
    """s [entries, rows, keys] of q k^T -> the probabilities P = exp(s scale - lse) (times
    the dropout multipliers `mul` when has_mul), and dp of dout v^T -> the score gradients
    dS = (dp mul - delta) P scale, in place; both 0 on masked keys. lse -inf reads as 0."""
    entries, rows, keys = s.shape
    for b in range(entries):
        for r in range(rows):
            srow, drow = s[b, r], dp[b, r]
            n = _limit(i0 + r, diag, keys)
            lb = lse[b, r]
            lb = _ZERO if lb == -np.inf else lb
            d = delta[b, r]
            if has_mul:
                mrow = mul[b, r]
                for j in range(n):
                    x = srow[j] * scale
                    p = _exp_f32(x - lb)
                    mj = mrow[j]
                    srow[j] = p * mj
                    g = drow[j] * mj
                    g -= d
                    g *= p
                    drow[j] = g * scale
            else:
                for j in range(n):
                    x = srow[j] * scale
                    p = _exp_f32(x - lb)
                    srow[j] = p
                    g = drow[j] - d
                    g *= p
                    drow[j] = g * scale
            for j in range(n, keys):
                srow[j] = _ZERO
                drow[j] = _ZERO
