"""The GEMM family's host implementation: np.matmul split over the host threads (BLAS on each
caller's thread) with alpha and the bias applied per part, and the float32 activation
epilogue (bias + GELU over cache-resident blocks of rows)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpuplan import host, host_pool

#: Multiply-adds a thread needs before a host GEMM is split (~0.1 ms of single-thread sgemm),
#: and the alignment of the rows or columns of C a split gives each thread. Both keep the
#: bits independent of the split: the BLAS microkernels' tiles divide the alignment, and
#: each part stays above OpenBLAS's small-matrix kernel (1M multiply-adds on AVX-512, which
#: sums in another order), so every part runs the kernel the whole product would
#: (tests/gpuplan/test_host_pool.py checks the bits for 1, 2 and 3 threads).
GEMM_GRAIN = 1 << 21
GEMM_ALIGN = 64
#: Multiply-adds per product below which OpenBLAS stays on its caller's thread by itself
#: (its threshold is 4 x 65536 by default; 65536 is its floor): such a GEMM skips the ~4 us
#: of switching the BLAS pool, which would double a small plan call.
BLAS_SERIAL = 1 << 16


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray, alpha: float = 1.0,
           bias: np.ndarray | None = None) -> np.ndarray:
    """out = a @ b (np.matmul, into `out` of the product's shape), then out *= alpha (when
    not 1) and out += bias (a row [n], when given), with BLAS on its caller's thread
    (host.blas_on_caller) and the work split over the host threads by batch entries, or by
    rows or columns of `out`, when each thread gets GEMM_GRAIN multiply-adds; each thread
    scales and adds the bias to its own part while it is in cache.

    Why not the BLAS's own threads: after a call, OpenBLAS's workers spin for a while, and
    the host ops that follow (split over these threads) then share the cores with spinning
    threads; with every GEMM on these threads the BLAS workers stay asleep."""
    m, n, k = out.shape[-2], out.shape[-1], a.shape[-1]
    batch = out.shape[0] if out.ndim > 2 else 1
    per_entry = m * n * k
    if per_entry < BLAS_SERIAL:
        return _finish(np.matmul(a, b, out=out), alpha, bias)
    with host.blas_on_caller():
        if host.thread_budget() <= 1 or batch * per_entry < 2 * GEMM_GRAIN:
            return _finish(np.matmul(a, b, out=out), alpha, bias)
        if batch >= host.thread_budget():
            def entries(lo: int, hi: int) -> None:
                _finish(np.matmul(a[lo:hi] if a.ndim > 2 else a, b[lo:hi] if b.ndim > 2
                                  else b, out=out[lo:hi]), alpha, bias)
            host_pool.parallel_for(batch, entries, -(-GEMM_GRAIN // max(1, per_entry)))
        elif m >= n:
            def rows(lo: int, hi: int) -> None:
                _finish(np.matmul(a[..., lo:hi, :], b, out=out[..., lo:hi, :]), alpha, bias)
            host_pool.parallel_for(m, rows, -(-GEMM_GRAIN // max(1, batch * n * k)), GEMM_ALIGN)
        else:
            def cols(lo: int, hi: int) -> None:
                _finish(np.matmul(a, b[..., lo:hi], out=out[..., lo:hi]), alpha,
                        None if bias is None else bias[..., lo:hi])
            host_pool.parallel_for(n, cols, -(-GEMM_GRAIN // max(1, batch * m * k)), GEMM_ALIGN)
    return out


def _finish(v: np.ndarray, alpha: float, bias: np.ndarray | None) -> np.ndarray:
    """v *= alpha (unless 1), v += bias (unless None), in place; returns v."""
    if alpha != 1:
        v *= v.dtype.type(alpha)
    if bias is not None:
        v += bias
    return v


def bias_activation(forward32: Callable[..., None], preact: np.ndarray, bias: np.ndarray | None,
                    out: np.ndarray, bias_forward32: Callable[..., None] | None = None) -> None:
    """preact += bias[n] (bias may be None), out = forward32(preact) over blocks of rows of
    a [..., n] float32 array (the host GEMM epilogue): each block's passes run on
    cache-resident rows, spread over the host threads. bias_forward32(p, bias, y), when
    given, does both on a block (the activation's one-pass form)."""
    n = preact.shape[-1]
    rows, dst = preact.reshape(-1, n), out.reshape(-1, n)

    def block(lo: int, hi: int) -> None:
        x = rows[lo:hi]
        if bias_forward32 is not None:
            bias_forward32(x, bias, dst[lo:hi])
            return
        if bias is not None:
            x += bias
        forward32(x, dst[lo:hi], np.empty_like(x), np.empty_like(x))

    with np.errstate(over="ignore", invalid="ignore"):
        host_pool.for_blocks(rows.shape[0], block, n)
