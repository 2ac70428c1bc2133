"""The host SKU (``numpy``) of the attention plans, forward and backward, in the accumulator
dtype (f32 for f16/bf16/f32, f64 for f64).

Work: chunks of batch entries (HOST_CHUNK_SCORES scores each, so that a chunk's scores stay
in cache between the passes over them) spread over the host threads (gpuplan.host_pool).
Within a chunk, a causal plan takes the query rows in blocks of CAUSAL_ROWS: a block's keys
stop at its last row's diagonal, so the GEMMs skip the masked upper triangle but for the
blocks' diagonal tiles (at Lq = Lk = 128, 3/4 of the full products). Per block:

    forward:  S = q k^T (BLAS); P = softmax(scale S) and lse; o = (P [* dropout]) v (BLAS)
    backward: S = q k^T, dP = dout v^T (BLAS); P = exp(scale S - lse),
              dS = (dP [* m] - delta) P scale; dq = dS k, dv += (P [* m])^T dout,
              dk += dS^T q (BLAS; the first block visited, the one seeing every key, assigns)

with delta = rowsum(dout o). Grouped-query attention (kv_group = G > 1): a chunk holds whole
groups, K/V entry c with its query entries cG .. cG + G - 1; the products broadcast the
entry's K/V over the group ([n, G, rows, D] times [n, 1, D, keys]: no per-head copy of K or
V), and dk, dv of entry c contract over the group's query heads and rows at once ([keys, G
rows] times [G rows, D]: one fixed-order GEMM per block). The softmax steps run as the
compiled float32 kernels of gpuplan.host_kernels_attention where they load
(gpuplan.host_jit) and take the operands, else as NumPy passes. Entries and rows are
independent, so the bits depend on neither the chunking nor the threads. A masked key is
left out of a row's products only when its row block does not reach it: an inf or NaN in v
or k at a masked key can still reach rows of the block holding the diagonal (0 * inf), as on
the device, whose tiles past the diagonal are skipped and whose diagonal tiles are not; the
float64 reference poisons every row. Dropout multipliers come from the plan's Philox stream
per chunk (gpuplan.ops.dropout.plans.keep_mask_host) under the call's head layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gpuplan import host_jit
from gpuplan.host_pool import parallel_for
from gpuplan.ops.dropout.plans import drop_scale, keep_mask_host

#: Scores per chunk of the host path (1 MiB of float32), and the fewest scores worth a
#: second thread: every NumPy call re-takes the GIL, so threads only pay for calls of
#: ~0.1 ms and more.
HOST_CHUNK_SCORES = 1 << 18
HOST_GRAIN_SCORES = 1 << 17
#: Query rows per block of a causal plan (see the module docstring).
CAUSAL_ROWS = 64
_EMPTY = np.zeros((0, 0, 0), np.float32)


def host_chunks(desc: Any, fn: Callable[[int, int], None]) -> None:
    """fn(c0, c1) over chunks [c0, c1) of the K/V entries (each with its kv_group query
    entries; HOST_CHUNK_SCORES scores at most, one entry at least), spread over the host
    threads (gpuplan.host_pool) when each gets HOST_GRAIN_SCORES. Entries are independent,
    so the bits do not depend on the split."""
    per_entry = max(1, desc.kv_group * desc.lq * desc.lk)
    step = max(1, HOST_CHUNK_SCORES // per_entry)
    grain = max(step, -(-HOST_GRAIN_SCORES // per_entry))

    def part(start: int, stop: int) -> None:
        for c0 in range(start, stop, step):
            fn(c0, min(c0 + step, stop))

    parallel_for(desc.batch // desc.kv_group, part, grain, align=step)


def grouped(desc: Any, a: np.ndarray) -> np.ndarray:
    """A query-side [batch, L, X] array as [batch // kv_group, kv_group, L, X] (a view)."""
    return a.reshape(desc.batch // desc.kv_group, desc.kv_group, *a.shape[1:])


def row_blocks(desc: Any) -> list[tuple[int, int, int]]:
    """(r0, r1, keys): query rows [r0, r1) see keys [0, keys) at most; the last block sees
    every key (all of them when not causal)."""
    if not desc.causal:
        return [(0, desc.lq, desc.lk)]
    diag = desc.lk - desc.lq
    return [(r0, min(desc.lq, r0 + CAUSAL_ROWS),
             max(0, min(desc.lk, min(desc.lq, r0 + CAUSAL_ROWS) + diag)))
            for r0 in range(0, desc.lq, CAUSAL_ROWS)]


def drop_entries(args: Any, b0: int, b1: int) -> list[tuple[int, int]]:
    """(first, count) runs of consecutive dropout entries of batch entries [b0, b1) under the
    call's head layout (gpuplan.ops.attention.plans's docstring)."""
    group, stride, shift = (int(args.drop_heads), int(args.drop_total_heads),
                            int(args.drop_first_head))
    runs: list[tuple[int, int]] = []
    b = b0
    while b < b1:
        stop = min(b1, (b // group + 1) * group)
        first = (b // group) * stride + shift + b % group
        if runs and runs[-1][0] + runs[-1][1] == first:
            runs[-1] = (runs[-1][0], runs[-1][1] + stop - b)
        else:
            runs.append((first, stop - b))
        b = stop
    return runs


def host_drop(desc: Any, args: Any, b0: int, b1: int, dtype: Any) -> np.ndarray:
    """The dropout multipliers [b1 - b0, lq, lk] of batch entries [b0, b1) in `dtype`:
    drop_scale where kept, 0 where dropped (the keep bits of the call's seed and offset)."""
    per = desc.lq * desc.lk
    keep = np.concatenate([
        keep_mask_host(count * per, desc.dropout, int(args.seed), int(args.offset),
                       start=first * per) for first, count in drop_entries(args, b0, b1)])
    scale = np.dtype(dtype).type(drop_scale(desc.dropout, dtype))
    return np.where(keep, scale, np.dtype(dtype).type(0)).reshape(b1 - b0, desc.lq, desc.lk)


def _diag(desc: Any) -> int:
    """Key j is masked for query i when j > i + diag (never, when not causal)."""
    return desc.lk - desc.lq if desc.causal else desc.lk


def _mask(desc: Any, r0: int, r1: int, keys: int) -> np.ndarray | None:
    """[r1 - r0, keys] bool, True where masked; None when nothing is."""
    mask = np.arange(keys)[None, :] > np.arange(r0, r1)[:, None] + _diag(desc)
    return mask if mask.any() else None


def _kernels(blocks: tuple, rows: tuple) -> Any:
    """gpuplan.host_kernels_attention when it loads (`host_jit.extra`: a numba error warns
    once and leaves the NumPy passes) and takes the operands (`blocks`: C-contiguous
    float32; `rows`: float32 views), else None."""
    if (not host_jit.takes(*blocks)
            or any(a.dtype != np.float32 or not a.flags.aligned for a in rows)):
        return None
    return host_jit.extra("host_kernels_attention")


def _softmax(desc: Any, s: np.ndarray, lse: np.ndarray, r0: int, r1: int) -> None:
    """s = q k^T of block rows [r0, r1) -> the probabilities in place, lse written."""
    kern = _kernels((s,), (lse,))
    if kern is not None:
        kern.softmax_block(s, np.float32(desc.scale), r0, _diag(desc), lse)
        return
    s *= s.dtype.type(desc.scale)
    mask = _mask(desc, r0, r1, s.shape[-1])
    if mask is not None:
        np.copyto(s, -np.inf, where=mask)
    m = s.max(axis=-1, keepdims=True)
    m[np.isneginf(m)] = 0  # fully masked rows (Lq > Lk): all exp(-inf) = 0
    s -= m
    np.exp(s, out=s)
    total = s.sum(axis=-1, keepdims=True)
    lse[...] = (m + np.log(total))[..., 0]
    s *= np.where(total > 0, 1 / np.where(total > 0, total, 1), 0)


def forward(desc: Any, args: Any, acc: np.dtype) -> None:
    """o and lse of the plan's args (module docstring)."""
    if desc.lk == 0:
        args.o[...] = 0
        args.lse[...] = -np.inf
        return
    q, k, v = (a.astype(acc, copy=False) for a in (args.q, args.k, args.v))
    blocks = row_blocks(desc)
    g = desc.kv_group
    q4, o4 = grouped(desc, q), grouped(desc, args.o)

    def chunk(c0: int, c1: int) -> None:
        b0, b1 = c0 * g, c1 * g  # the chunk's query entries
        qc, kt, vc = q4[c0:c1], np.swapaxes(k[c0:c1], -1, -2)[:, None], v[c0:c1, None]
        mul = host_drop(desc, args, b0, b1, acc) if desc.dropout > 0 else None
        for r0, r1, keys in blocks:
            o, lse = o4[c0:c1, :, r0:r1], args.lse[b0:b1, r0:r1]
            if keys == 0:
                o[...] = 0
                lse[...] = -np.inf
                continue
            s4 = np.matmul(qc[:, :, r0:r1], kt[..., :keys])  # [n, G, rows, keys]
            s = s4.reshape(b1 - b0, r1 - r0, keys)  # a view: one entry per query entry
            _softmax(desc, s, lse, r0, r1)
            if mul is not None:
                s *= mul[:, r0:r1, :keys]
            if o.dtype == acc:
                np.matmul(s4, vc[:, :, :keys], out=o)
            else:
                o[...] = np.matmul(s4, vc[:, :, :keys])

    with np.errstate(invalid="ignore", divide="ignore"):
        host_chunks(desc, chunk)


def _grad_scores(desc: Any, s: np.ndarray, dp: np.ndarray, lse: np.ndarray,
                 delta: np.ndarray, mul: np.ndarray | None, r0: int, r1: int) -> None:
    """s = q k^T, dp = dout v^T of block rows [r0, r1) -> P (times the dropout multipliers)
    and dS in place."""
    kern = _kernels((s, dp, mul), (lse, delta))
    if kern is not None:
        kern.grad_scores_block(s, dp, np.float32(desc.scale), r0, _diag(desc), lse, delta,
                               _EMPTY if mul is None else mul, mul is not None)
        return
    s *= s.dtype.type(desc.scale)
    mask = _mask(desc, r0, r1, s.shape[-1])
    if mask is not None:
        np.copyto(s, -np.inf, where=mask)
    # Fully masked rows have lse = -inf and every score -inf: P = 0 there.
    s -= np.where(np.isneginf(lse), 0, lse)[..., None]
    p = np.exp(s, out=s)
    if mul is not None:
        dp *= mul
    dp -= delta[..., None]
    dp *= p
    dp *= s.dtype.type(desc.scale)
    if mask is not None:  # 0, as the kernel writes, even where dp is inf (0 * inf)
        np.copyto(dp, 0, where=mask)
    if mul is not None:
        p *= mul


def backward(desc: Any, args: Any, acc: np.dtype) -> None:
    """dq, dk and dv of the plan's args (module docstring)."""
    if desc.lq == 0 or desc.lk == 0:
        for g in (args.dq, args.dk, args.dv):
            g[...] = 0
        return
    q, k, v, o, lse, dout = (a.astype(acc, copy=False)
                             for a in (args.q, args.k, args.v, args.o, args.lse, args.dout))
    blocks = row_blocks(desc)[::-1]  # the last block sees every key: it assigns dk and dv
    g = desc.kv_group
    q4, do4, dq4 = grouped(desc, q), grouped(desc, dout), grouped(desc, args.dq)

    def chunk(c0: int, c1: int) -> None:
        n, b0, b1 = c1 - c0, c0 * g, c1 * g  # K/V entries; the chunk's query entries
        qc, doc, kc = q4[c0:c1], do4[c0:c1], k[c0:c1]
        kt, vt = np.swapaxes(kc, -1, -2)[:, None], np.swapaxes(v[c0:c1], -1, -2)[:, None]
        delta = np.einsum("bid,bid->bi", dout[b0:b1], o[b0:b1])
        mul = host_drop(desc, args, b0, b1, acc) if desc.dropout > 0 else None
        dk = np.empty_like(kc) if args.dk.dtype != acc else args.dk[c0:c1]
        dv = np.empty_like(kc) if args.dv.dtype != acc else args.dv[c0:c1]
        first = True
        for r0, r1, keys in blocks:
            if keys == 0:
                args.dq[b0:b1, r0:r1] = 0
                continue
            rows = r1 - r0
            qb, dob = qc[:, :, r0:r1], doc[:, :, r0:r1]  # [n, G, rows, D]
            s4 = np.matmul(qb, kt[..., :keys])  # [n, G, rows, keys]
            dp4 = np.matmul(dob, vt[..., :keys])
            mb = None if mul is None else np.ascontiguousarray(mul[:, r0:r1, :keys])
            _grad_scores(desc, s4.reshape(b1 - b0, rows, keys),
                         dp4.reshape(b1 - b0, rows, keys), lse[b0:b1, r0:r1],
                         delta[:, r0:r1], mb, r0, r1)
            dq4[c0:c1, :, r0:r1] = np.matmul(dp4, kc[:, None, :keys])
            # dk, dv of a K/V entry: one product over its group's query rows (g * rows; a
            # view for g = 1, else a copy of the query-side rows, never of K or V).
            st = np.swapaxes(s4.reshape(n, g * rows, keys), -1, -2)
            dpt = np.swapaxes(dp4.reshape(n, g * rows, keys), -1, -2)
            qr, dor = qb.reshape(n, g * rows, -1), dob.reshape(n, g * rows, -1)
            if first:  # the last row block: keys == lk (row_blocks), so every key row
                np.matmul(st, dor, out=dv)
                np.matmul(dpt, qr, out=dk)
                first = False
            else:
                dv[:, :keys] += np.matmul(st, dor)
                dk[:, :keys] += np.matmul(dpt, qr)
        if args.dk.dtype != acc:
            args.dk[c0:c1] = dk
            args.dv[c0:c1] = dv

    with np.errstate(invalid="ignore", divide="ignore"):
        host_chunks(desc, chunk)
