"""Context parallelism: each rank of a cp group holds a load-balanced slice of every sequence,
and causal attention runs as ring attention over the group.

Layout. A sequence of ``T`` tokens is cut into ``2 n`` equal chunks (``n`` the group size);
rank ``i`` holds chunks ``i`` and ``2n - 1 - i``, in that order, as one local sequence of
``T / n`` tokens. Under a causal mask the early chunks see few keys and the late ones many,
so pairing chunk ``i`` with its mirror gives every rank the same work.

Ring attention (`ring_attention`). Rank ``r`` keeps its queries and passes its keys and
values around the ring ``r -> r + 1``: at step ``s`` it holds the K/V of rank
``(r - s) mod n``, sends them on and receives the next while it computes with them. Each
(query chunk, key chunk) pair is fully visible (key chunk before the query chunk), causal
on the diagonal (the same chunk), or skipped (key chunk after), by the chunks' global
indices. Blocks are computed by the fused attention plans (`gpuplan.functional.attention`,
which returns the output and its per-row log-sum-exp) and merged by log-sum-exp:
``lse = logaddexp(lse_1, lse_2)``, ``o = o_1 exp(lse_1 - lse) + o_2 exp(lse_2 - lse)``.
Backward runs the plans' backward per block with the final output and log-sum-exp (the
FlashAttention-2 form: ``P = exp(scale S - lse)``, ``delta = rowsum(dO O)``), passing the
K/V around the ring again with the partial dK/dV sums following them one step behind;
after ``n`` steps each rank holds the dK/dV of its own keys and values.

Messages go through host buffers (device arrays are staged), sent with
`Communicator.isend` and received with MPI ``Irecv`` on the group's mpi4py communicator
(the Communicator has no non-blocking receive), so the transfer overlaps the block compute.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import gpuplan.functional as F
from autograd.function import Function
from autograd.functions.attention import kv_group
from autograd.tensor import Tensor
from dist.communicator import Communicator, PendingSend
from dist.watchdog import watched
from gpuplan import backend
from gpuplan.errors import InvalidProblem, describe

KV_TAG, GRAD_TAG = 7101, 7102


# -- layout ----------------------------------------------------------------------------------


def chunk_indices(size: int, rank: int) -> tuple[int, int]:
    """The global chunk indices (of ``2 size``) that context-parallel rank `rank` holds:
    ``(rank, 2 size - 1 - rank)``."""
    return rank, 2 * size - 1 - rank


def check_length(n: int, size: int, op: str, arg: str = "idx") -> int:
    """Chunk length ``n / (2 size)``; InvalidProblem naming `op` and `arg` unless ``2 size``
    divides the sequence length `n`."""
    if n % (2 * size):
        raise InvalidProblem(describe(op, arg, f"a sequence length divisible by 2 * cp = "
                                      f"{2 * size} (context parallel)", n))
    return n // (2 * size)


def local_positions(n: int, size: int, rank: int) -> np.ndarray:
    """Global positions (int64) of the ``n / size`` tokens that rank `rank` of a group of
    `size` holds of a sequence of `n`: chunk ``rank`` then chunk ``2 size - 1 - rank``."""
    c = check_length(n, size, "local_positions", "n")
    lo, hi = chunk_indices(size, rank)
    return np.concatenate([np.arange(lo * c, (lo + 1) * c), np.arange(hi * c, (hi + 1) * c)])


def take_local(x: Any, comm: Communicator | None, axis: int = 1, op: str = "take_local",
               arg: str = "idx") -> Any:
    """This rank's slice of the whole sequences `x` (an array) along `axis`: its two chunks,
    concatenated (a copy). The identity without a group (or a group of one)."""
    if comm is None or comm.size == 1:
        return x
    axis %= x.ndim
    c = check_length(x.shape[axis], comm.size, op, arg)
    lo, hi = chunk_indices(comm.size, comm.rank)
    pick = [slice(None)] * x.ndim
    parts = []
    for chunk in (lo, hi):
        pick[axis] = slice(chunk * c, (chunk + 1) * c)
        parts.append(x[tuple(pick)])
    return backend.concatenate(parts, axis=axis)


def gather_sequence(x: Any, comm: Communicator | None, axis: int = 1) -> Any:
    """The whole sequences from every rank's local slice `x` (an array; inverse of
    `take_local`): all-gathered over the group and put back in sequence order."""
    if comm is None or comm.size == 1:
        return x
    axis %= x.ndim
    n, c = comm.size, x.shape[axis] // 2
    gathered = comm.all_gather(backend.ascontiguous(x), axis=axis)
    pick = [slice(None)] * x.ndim
    parts: list[Any] = [None] * (2 * n)
    for r in range(n):
        for j, chunk in enumerate(chunk_indices(n, r)):
            start = (2 * r + j) * c
            pick[axis] = slice(start, start + c)
            parts[chunk] = gathered[tuple(pick)]
    return backend.concatenate(parts, axis=axis)


# -- ring messages ---------------------------------------------------------------------------


class _RingExchange:
    """One step's message: `send` (an array) to the next rank, the same shape and dtype
    received from the previous one, both in flight until `wait` (host-staged)."""

    def __init__(self, comm: Communicator, send: Any, tag: int) -> None:
        self.comm, self.tag = comm, tag
        n, r = comm.size, comm.rank
        self.prev, self.next = (r - 1) % n, (r + 1) % n
        self.device = backend.device_of(send)
        self.buf = np.empty(send.shape, dtype=np.dtype(send.dtype))
        self.request = comm.mpi_comm.Irecv(self.buf.reshape(-1).view(np.uint8),
                                           source=self.prev, tag=tag)
        self.pending: PendingSend = comm.isend(send, self.next, tag)

    def wait(self) -> Any:
        watched("ring_attention recv", self.comm, self.prev, self.request.Wait)
        self.pending.wait()
        return backend.to_device(self.buf, self.device)


# -- ring attention --------------------------------------------------------------------------


def _blocks(size: int, rank: int, src: int) -> list[tuple[int, slice, bool]]:
    """(query chunk 0/1, local key columns, causal) of the blocks that rank `rank`'s queries
    attend to among rank `src`'s keys; key chunks wholly visible to a query chunk are one
    block (they are adjacent in the local layout)."""
    mine, theirs = chunk_indices(size, rank), chunk_indices(size, src)
    out = []
    for a, qc in enumerate(mine):
        full = [b for b, kc in enumerate(theirs) if kc < qc]
        if full:
            out.append((a, slice(full[0], full[-1] + 1), False))
        out.extend((a, slice(b, b + 1), True) for b, kc in enumerate(theirs) if kc == qc)
    return out


def _accumulator(dtype: Any) -> Any:
    """The dtype partial results and gradient sums are kept in: float32 for 16-bit inputs
    (their blocks come from several ring steps), the inputs' own otherwise."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def _merge(o: Any, lse: Any, o_blk: Any, lse_blk: Any) -> tuple[Any, Any]:
    """The log-sum-exp merge of two partial attention results over disjoint key sets."""
    if o is None:
        return o_blk.astype(_accumulator(o_blk.dtype), copy=False), lse_blk
    xp = backend.array_namespace(o)
    new = xp.logaddexp(lse, lse_blk)
    return (o * xp.exp(lse - new)[..., None] + o_blk * xp.exp(lse_blk - new)[..., None], new)


class RingAttention(Function):
    """Causal attention of this rank's local sequences (chunks ``i`` and ``2n - 1 - i``),
    keys and values passed around the context-parallel ring (module docstring). q
    ``[..., H, L, D]``, k, v ``[..., Hkv, L, D]`` (``Hkv`` dividing ``H``)."""

    @staticmethod
    def forward(ctx, q, k, v, comm, scale):
        n, r = comm.size, comm.rank
        q3 = backend.ascontiguous(q.reshape((-1,) + q.shape[-2:]))
        k3 = k.reshape((-1,) + k.shape[-2:])
        v3 = v.reshape((-1,) + v.shape[-2:])
        group = q3.shape[0] // k3.shape[0]
        c = q3.shape[1] // 2
        queries = [q3[:, :c], q3[:, c:]]
        outs: list[Any] = [None, None]
        lses: list[Any] = [None, None]
        kv = backend.stack([k3, v3])
        for step in range(n):
            ring = _RingExchange(comm, kv, KV_TAG) if step < n - 1 else None
            for a, cols, causal in _blocks(n, r, (r - step) % n):
                keys = slice(cols.start * c, cols.stop * c)
                o_blk, lse_blk = F.attention(queries[a], kv[0][:, keys], kv[1][:, keys],
                                             scale=scale, causal=causal, kv_group=group)
                outs[a], lses[a] = _merge(outs[a], lses[a], o_blk, lse_blk)
            if ring is not None:
                kv = ring.wait()
        o = backend.concatenate(outs, axis=1).astype(q3.dtype, copy=False)
        lse = backend.concatenate(lses, axis=1)
        ctx.comm, ctx.scale, ctx.group, ctx.shapes = comm, scale, group, (q.shape, k.shape)
        ctx.save_for_backward(q3, backend.ascontiguous(k3), backend.ascontiguous(v3), o, lse)
        return o.reshape(q.shape)

    @staticmethod
    def backward(ctx, dout):
        q3, k3, v3, o, lse = ctx.saved
        comm, scale, group = ctx.comm, ctx.scale, ctx.group
        n, r = comm.size, comm.rank
        c = q3.shape[1] // 2
        xp = backend.array_namespace(q3)
        do3 = backend.ascontiguous(dout.reshape(o.shape))
        halves = [slice(0, c), slice(c, 2 * c)]
        acc = _accumulator(q3.dtype)
        dq = xp.zeros(q3.shape, dtype=acc)
        kv = backend.stack([k3, v3])
        grads = None  # the partial dK/dV of the current K/V's owner, from the previous rank
        incoming = None
        for step in range(n):
            ring = _RingExchange(comm, kv, KV_TAG) if step < n - 1 else None
            part = xp.zeros(kv.shape, dtype=acc)
            for a, cols, causal in _blocks(n, r, (r - step) % n):
                keys, rows = slice(cols.start * c, cols.stop * c), halves[a]
                dq_blk, dk_blk, dv_blk = F.attention_backward(
                    q3[:, rows], kv[0][:, keys], kv[1][:, keys], o[:, rows], lse[:, rows],
                    do3[:, rows], scale=scale, causal=causal, kv_group=group)
                dq[:, rows] += dq_blk
                part[0][:, keys] += dk_blk
                part[1][:, keys] += dv_blk
            grads = part if incoming is None else incoming.wait() + part
            incoming = _RingExchange(comm, grads, GRAD_TAG)
            if ring is not None:
                kv = ring.wait()
        grads = incoming.wait()  # the whole dK/dV of this rank's own keys and values
        q_shape, k_shape = ctx.shapes
        need_q, need_k, need_v = ctx.needs_input_grad
        dtype = q3.dtype
        return (dq.astype(dtype, copy=False).reshape(q_shape) if need_q else None,
                grads[0].astype(dtype, copy=False).reshape(k_shape) if need_k else None,
                grads[1].astype(dtype, copy=False).reshape(k_shape) if need_v else None)


def ring_attention(q: Tensor, k: Tensor, v: Tensor, comm: Communicator | None,
                   scale: float | None = None) -> Tensor:
    """Causal scaled dot-product attention of whole sequences split over the
    context-parallel group `comm`: q ``[..., H, L, D]``, k, v ``[..., Hkv, L, D]`` hold this
    rank's local tokens (chunks ``i`` and ``2n - 1 - i`` of the sequence, `take_local`;
    ``Hkv`` dividing ``H``: grouped-query attention), and the result is this rank's rows of
    ``scaled_dot_product_attention(Q, K, V, is_causal=True)`` of the whole sequences.
    Without a group (or a group of one) it is that attention on the local sequences.
    No dropout: the fused plans key their masks to a block's own rows and columns."""
    kv_group(q, k, v, "ring_attention")
    if v.shape[-1] != q.shape[-1]:
        raise InvalidProblem(describe("ring_attention", "v", f"a value width equal to the "
                                      f"query width {q.shape[-1]}", v.shape[-1]))
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if comm is None or comm.size == 1:
        from autograd.functions.attention import scaled_dot_product_attention

        return scaled_dot_product_attention(q, k, v, is_causal=True, scale=s,
                                            enable_gqa=k.shape[-3] != q.shape[-3])
    check_length(q.shape[-2] * comm.size, comm.size, "ring_attention", "q")
    return RingAttention.apply(q, k, v, comm=comm, scale=s)


__all__ = ["RingAttention", "check_length", "chunk_indices", "gather_sequence",
           "local_positions", "ring_attention", "take_local"]
