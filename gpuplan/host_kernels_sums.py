"""Compiled float32 host kernels (numba) that sum rows into others: the column sums of the
host reduce over leading axes (a bias gradient) and the embedding backward's scatter-add.

Both give the NumPy path's bits: float32 additions in its order. Column sums add row by row
from zero, NumPy's order for a float32 sum over axis 0; the embedding backward sums each
target row's gradients from zero in ascending index position, then adds that sum to the
table's row once (gpuplan.ops.embedding.plans's `_sequential_segment_sum`, the device segment
kernel's order). Loaded through `gpuplan.host_jit.extra("host_kernels_sums")`; the GIL is
released.

Cache: numba's on-disk cache keys these kernels on this file's stamp, not on the options they
take from gpuplan.host_kernels (`_OPTIONS`): after editing those, touch this file (or clear
its __pycache__) so that the kernels recompile.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from gpuplan.host_kernels import _IN_ROWS, _OPTIONS, _ROWS, _VEC

_IN_I64 = types.Array(types.int64, 1, "C", readonly=True)
_IN_BOOL = types.Array(types.boolean, 1, "C", readonly=True)


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


@njit(types.void(_IN_ROWS, _IN_I64, _IN_BOOL, _ROWS), **_OPTIONS)
def embedding_backward(dout, rows, keep, dweight):
    """dweight[rows[i]] += dout[i] for every i with keep[i]: per target row, the sum of its
    gradients from zero in ascending i (float32), then one add into dweight."""
    n, d = dout.shape
    slot = np.full(dweight.shape[0], -1, np.int64)  # target row -> its sum's row in acc
    target = np.empty(n, np.int64)
    used = 0
    for i in range(n):
        if keep[i] and slot[rows[i]] < 0:
            slot[rows[i]] = used
            target[used] = rows[i]
            used += 1
    acc = np.zeros((used, d), np.float32)
    for i in range(n):
        if keep[i]:
            a = acc[slot[rows[i]]]
            g = dout[i]
            for j in range(d):
                a[j] += g[j]
    for k in range(used):
        w, a = dweight[target[k]], acc[k]
        for j in range(d):
            w[j] = w[j] + a[j]
