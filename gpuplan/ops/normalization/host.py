"""Host math of the LayerNorm / RMSNorm families (gpuplan.ops.normalization.plans) and of residual +
LayerNorm (gpuplan.ops.residual_norm.plans): rows in cache-sized blocks over the host threads
(gpuplan.host_pool.for_blocks).

float32 rows run the compiled kernels of gpuplan.host_kernels when gpuplan.host_jit has them:
a few vectorized passes per row, float32 statistics whose row sums the compiler may
reassociate (see there); an input of one block (every small one) is one kernel call on the
calling thread. The callers are plans, whose operand check (one dtype, C-contiguous,
aligned) is what the kernels' signatures ask for: the arrays are not checked again.
Otherwise, and for f64 / f16 / bf16, NumPy passes with statistics
in the accumulator dtype (float64 for f64). Parameter gradients add per-block partial sums in
block order, and blocks are a function of the shape, so every result is bit-identical for
any thread count. The residual forms compute s = x + residual and dx + ds as float32 (or
accumulator) adds rounded to the dtype, as the binary add plan does: the fused ops give the
composed ops' bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import host_jit, host_pool
from gpuplan.dtypes import accumulator
from gpuplan.host_pool import block_rows, for_blocks

_NONE64 = np.empty(0)  # an absent float64 partial-sum row


def _stats(x: np.ndarray, rms: bool, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NumPy statistics in the accumulator dtype of each row of x [R, D]: (mean, rstd, the
    centred rows x - mean as a fresh array); mean is zeros for RMSNorm."""
    acc = accumulator(x.dtype)
    dim = x.shape[1]
    inv = acc.type(1.0 / dim if dim else 0.0)
    if rms:
        mean = np.zeros(x.shape[0], acc)
        c = x.astype(acc)  # x - 0, exactly
    else:
        a = x.astype(acc, copy=False)
        mean = a.sum(axis=1)
        mean *= inv
        c = a - mean[:, None]
    rstd = np.square(c).sum(axis=1)
    rstd *= inv
    rstd += acc.type(eps)
    np.sqrt(rstd, out=rstd)
    np.divide(acc.type(1), rstd, out=rstd)
    return mean, rstd, c


def _f32_kernels(x: np.ndarray) -> Any:
    """The compiled kernels for a float32 plan's operands, else None. The plan checked every
    operand against its descriptor (one dtype, C-contiguous, aligned): what the kernels'
    signatures take, so x's dtype settles it."""
    return host_jit.kernels() if x.dtype == np.float32 else None


def forward(x: np.ndarray, weight: Any, bias: Any, y: np.ndarray, mean: Any, rstd: np.ndarray,
            eps: float, rms: bool, residual: Any = None, s: Any = None) -> None:
    """y, mean (None for RMSNorm), rstd of the rows of x [rows, dim]; with `residual`, the
    rows are those of s = x + residual, written to `s` first."""
    rows, dim = x.shape
    k = _f32_kernels(x)
    if k is not None:
        empty, no_rows = rstd[:0], y[:0]  # absent operands: empty float32 arrays
        has_res = residual is not None
        flags = (float(np.float32(eps)), has_res, rms, weight is not None, bias is not None)
        weight = empty if weight is None else weight
        bias = empty if bias is None else bias
        has_mean = mean is not None
        mean = mean if has_mean else empty
        step = block_rows(dim)
        if rows <= step:  # one block (every small input): one call, on this thread
            k.norm_forward(x, residual if has_res else no_rows, s if has_res else no_rows,
                           weight, bias, y, mean, rstd, *flags)
            return

        def block32(lo: int, hi: int) -> None:
            k.norm_forward(x[lo:hi], residual[lo:hi] if has_res else no_rows,
                           s[lo:hi] if has_res else no_rows, weight, bias, y[lo:hi],
                           mean[lo:hi] if has_mean else empty, rstd[lo:hi], *flags)

        for_blocks(rows, block32, dim, rows_per_block=step, grain=host_pool.KERNEL_GRAIN)
        return
    if residual is not None:
        acc = accumulator(x.dtype)
        s[...] = x.astype(acc, copy=False) + residual.astype(acc, copy=False)
        x = s
    acc = accumulator(x.dtype)
    weight = None if weight is None else weight.astype(acc, copy=False)
    bias = None if bias is None else bias.astype(acc, copy=False)

    def block(lo: int, hi: int) -> None:
        m, r, out = _stats(x[lo:hi], rms, eps)
        out *= r[:, None]
        if weight is not None:
            out *= weight
        if bias is not None:
            out += bias
        y[lo:hi], rstd[lo:hi] = out, r
        if mean is not None:
            mean[lo:hi] = m

    for_blocks(rows, block, dim)


def backward(dy: np.ndarray, x: np.ndarray, weight: Any, mean: Any, rstd: np.ndarray,
             dx: np.ndarray, dweight: Any, dbias: Any, rms: bool, ds: Any = None) -> None:
    """dx (+ ds when given), and dweight / dbias when not None, of the rows of x [rows, dim]
    (mean None for RMSNorm); see gpuplan.ops.normalization.plans for the math."""
    rows, dim = x.shape
    step = block_rows(dim)
    parts = (-(-rows // step), dim)
    k = _f32_kernels(x)
    if k is not None:
        part_w = None if dweight is None else np.zeros(parts)
        part_b = None if dbias is None else np.zeros(parts)
        empty, none64 = rstd[:0], _NONE64
        flags = (rms, weight is not None, ds is not None, part_w is not None,
                 part_b is not None)
        weight = empty if weight is None else weight
        if 0 < rows <= step:  # one block (every small input): one call, on this thread
            k.norm_backward(dy, x, weight, empty if mean is None else mean, rstd,
                            x[:0] if ds is None else ds, dx,
                            none64 if part_w is None else part_w[0],
                            none64 if part_b is None else part_b[0], *flags)
        else:
            def block32(lo: int, hi: int) -> None:
                b = lo // step
                k.norm_backward(dy[lo:hi], x[lo:hi], weight,
                                empty if mean is None else mean[lo:hi], rstd[lo:hi],
                                x[:0] if ds is None else ds[lo:hi], dx[lo:hi],
                                none64 if part_w is None else part_w[b],
                                none64 if part_b is None else part_b[b], *flags)

            for_blocks(rows, block32, dim, rows_per_block=step,
                       grain=host_pool.KERNEL_GRAIN)
    else:
        part_w, part_b = _backward_numpy(dy, x, weight, mean, rstd, dx, dweight is not None,
                                         dbias is not None, rms, step, parts)
        if ds is not None:
            acc = accumulator(x.dtype)
            dx[...] = dx.astype(acc, copy=False) + ds.astype(acc, copy=False)
    if part_w is not None:
        dweight[...] = part_w.sum(axis=0)
    if part_b is not None:
        dbias[...] = part_b.sum(axis=0)


def _backward_numpy(dy, x, weight, mean, rstd, dx, want_w, want_b, rms, step, parts):
    """dx by NumPy passes; returns the per-block partial sums of dweight and dbias (None when
    not wanted)."""
    # dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight (mean(g) = 0
    # for RMSNorm); dweight = sum over rows of dy * xhat; dbias = sum over rows of dy,
    # each the sum of per-block partial sums in block order.
    acc = accumulator(x.dtype)
    inv = acc.type(1.0 / x.shape[1])
    weight = None if weight is None else weight.astype(acc, copy=False)
    part_w = np.empty(parts, acc) if want_w else None
    part_b = np.empty(parts, acc) if want_b else None

    def block(lo: int, hi: int) -> None:
        g_dy = dy[lo:hi].astype(acc, copy=False)
        r = rstd[lo:hi].astype(acc, copy=False)[:, None]
        xhat = x[lo:hi].astype(acc)
        if not rms:
            xhat -= mean[lo:hi].astype(acc, copy=False)[:, None]
        xhat *= r
        g = g_dy if weight is None else g_dy * weight
        b = lo // step
        if part_w is not None:
            np.sum(g_dy * xhat, axis=0, out=part_w[b])
        if part_b is not None:
            np.sum(g_dy, axis=0, out=part_b[b])
        proj = (g * xhat).sum(axis=1, keepdims=True)
        proj *= inv
        out = g.copy() if rms else g - g.sum(axis=1, keepdims=True) * inv
        xhat *= proj
        out -= xhat
        out *= r
        dx[lo:hi] = out

    for_blocks(x.shape[0], block, x.shape[1], rows_per_block=step)
    return part_w, part_b
