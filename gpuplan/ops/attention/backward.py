"""Fused attention backward: dq, dk, dv from q, k, v, o, lse and dout (FlashAttention-2 style).

With the forward's lse (attention.py), per batch entry and unmasked (i, j):

    P_ij  = exp(scale * q_i . k_j - lse_i)             (recomputed, 0 where masked)
    delta_i = dout_i . o_i                              (= sum_j P_ij dout_i . v_j)
    dS_ij = P_ij (dout_i . v_j - delta_i)
    dv_j = sum_i P_ij dout_i,   dk_j = scale sum_i dS_ij q_i,   dq_i = scale sum_j dS_ij k_j

The device SKUs compute delta first (workspace: [B, Lq] accumulators), then dk and dv with one
CTA per key tile looping over the query tiles, then dq with one CTA per query tile looping
over the key tiles: every gradient element is written by one thread, no atomics, so the
result is deterministic (`PlanPreference(deterministic=True)` selects them).

With dropout (the forward's keep bits regenerated from seed and offset, m_ij = keep_ij /
(1 - p)): dv_j = sum_i m_ij P_ij dout_i and dS_ij = P_ij (m_ij dout_i . v_j - delta_i); delta
is unchanged, since o already holds the dropped probabilities.

Grouped-query attention (kv_group = G > 1: query entry b reads K/V entry b // G, plans.py):
dk_j and dv_j of K/V entry c also sum the terms above over the group's query entries
cG, ..., cG + G - 1. The device dk/dv kernels give each CTA one key tile of one K/V entry and
loop over the group's query entries in order, accumulating in registers: still one writer
per element and a fixed summation order, no atomics, no per-query-head copy of K, V, dK or
dV.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, HALF_DTYPES, cuda_name
from gpuplan.execute import call
from gpuplan.nvrtc import CudaModule, allow_dynamic_smem, cdiv, launch
from gpuplan.ops.attention import host as attention_host
from gpuplan.ops.attention.plans import (
    FIELDS,
    KV_SHAPE,
    LSE_SHAPE,
    Q_SHAPE,
    RNG,
    SIMT_CHUNKS,
    SIMT_THREADS,
    TC_HEAD_DIMS,
    TC_THREADS,
    AttentionDescriptor,
    _AttentionBase,
    contiguous,
    drop_layout,
    lse_dtype,
    simt_smem,
    tc_tile_bytes,
)
from gpuplan.spec import In, OpSpec, Out
from gpuplan.stream import Stream, Workspace

__all__ = ["AttentionBackwardDescriptor", "AttentionBackwardArgs", "AttentionBackwardPlan"]
__functional__ = ["attention_backward"]

#: SIMT backward (attention_backward.cu): 16 owned rows per CTA, 32 streamed rows per tile.
SIMT_BO, SIMT_BS = 16, 32
#: Tensor-core backward (attention_backward_tc.cu): 64 owned rows per CTA (16 per warp);
#: dk/dv stream query tiles of TC_DKDV_ROWS[head_dim] rows (fewer for D = 128: register
#: pressure), dq streams 64-key tiles.
TC_BO, TC_DKDV_ROWS, TC_DQ_ROWS = 64, {64: 64, 128: 32}, 64
_BOOL = ("false", "true")
_DELTA_GRID_MAX = 1 << 16


def _simt(kind: str, t: str, c: int) -> str:
    return f"attn::attention_backward_{kind}_simt<{t}, {c}>"


def _tc(kind: str, t: str, dim: int, vec: bool) -> str:
    return f"attn::attention_backward_{kind}_tc<{t}, {dim}, {_BOOL[vec]}>"


_SIMT_MODULE = CudaModule(
    __file__,
    "attention_backward.cu",
    [f"attn::attention_backward_delta<{cuda_name(t)}>" for t in FLOAT_DTYPES]
    + [_simt(kind, cuda_name(t), c) for kind in ("dkdv", "dq") for t in FLOAT_DTYPES
       for c in SIMT_CHUNKS],
)
_TC_MODULE = CudaModule(
    __file__,
    "attention_backward_tc.cu",
    [_tc(kind, cuda_name(t), dim, vec) for kind in ("dkdv", "dq") for t in HALF_DTYPES
     for dim in TC_HEAD_DIMS for vec in (False, True)],
)

BACKWARD = OpSpec(
    "attention_backward", fields=FIELDS,
    operands=(In("q", Q_SHAPE), In("k", KV_SHAPE), In("v", KV_SHAPE), In("o", Q_SHAPE),
              In("lse", LSE_SHAPE, lse_dtype), In("dout", Q_SHAPE), Out("dq", Q_SHAPE),
              Out("dk", KV_SHAPE), Out("dv", KV_SHAPE)), scalars=RNG)
#: forward and backward share the descriptor (same fields).
AttentionBackwardDescriptor = AttentionDescriptor
BACKWARD.descriptor_cls = AttentionDescriptor
AttentionBackwardArgs = BACKWARD.args(
    "AttentionBackwardArgs", "q, k, v, o (the forward output), lse (the forward's), dout "
    "[B, Lq, D] in (k, v [B // kv_group, Lk, D]); dq [B, Lq, D], dk, dv "
    "[B // kv_group, Lk, D] written; seed, offset and the head layout: the forward's.")


class AttentionBackwardPlan(_AttentionBase):
    """(dq, dk, dv) of attention as in the module docstring.

    SKUs on a GPU: ``tensor_core`` (f16/bf16, head_dim 64 or 128, sm_80+): dk/dv with 64 keys
    per CTA (16 per warp) over the query tiles of each query entry of its K/V entry's group,
    dq with 64 queries per CTA over key tiles; S, dP and the three gradient products by
    mma.sync m16n8k16 with f32 accumulators (P and dS are rounded to the input dtype to feed
    the mma). ``simt`` (every dtype, head_dim <= 128):
    16 owned rows per CTA, 32-row streamed tiles, accumulating in f32 for half types.
    Workspace: the [B, Lq] delta in the accumulator dtype. Host: ``numpy``
    (gpuplan.ops.attention.host).
    """

    op = "attention_backward"
    spec = BACKWARD
    _ws_per_row = 1

    def _prepare(self) -> None:
        super()._prepare()
        d = self.desc
        if self._cand.variant == "numpy":
            return
        rows = d.batch * d.lq
        self._delta = (f"attn::attention_backward_delta<{self._t}>",
                       max(1, min(cdiv(rows, 4), _DELTA_GRID_MAX)), np.int64(rows),
                       np.int64(d.head_dim))
        owned = TC_BO if self._tc else SIMT_BO
        k_tiles, q_tiles = cdiv(d.lk, owned), cdiv(d.lq, owned)
        # dk/dv: one CTA per key tile of each K/V entry (it loops over the entry's group).
        self._grids = (k_tiles * (d.batch // d.kv_group), q_tiles * d.batch)
        extents = (np.int64(d.lq), np.int64(d.lk), np.int64(d.head_dim))
        group = np.int64(d.kv_group)
        self._consts = (extents + (np.int64(k_tiles), group),
                        extents + (np.int64(q_tiles), group))
        dim = d.head_dim
        if self._tc:
            rows_kv = TC_DKDV_ROWS[dim]
            self._module, self._block = _TC_MODULE, TC_THREADS
            self._kernels = tuple((_tc("dkdv", self._t, dim, vec), _tc("dq", self._t, dim, vec))
                                  for vec in (False, True))
            own = tc_tile_bytes(TC_BO, dim)
            # dk/dv: K, V once, then Q, dO double-buffered and lse, delta (f32) per row;
            # dq: Q, dO once, then K, V double-buffered.
            self._smem = (2 * own + 4 * tc_tile_bytes(rows_kv, dim) + 2 * 2 * rows_kv * 4,
                          2 * own + 4 * tc_tile_bytes(TC_DQ_ROWS, dim))
        else:
            self._module, self._block = _SIMT_MODULE, SIMT_THREADS
            c = self._chunks
            self._kernels = ((_simt("dkdv", self._t, c), _simt("dq", self._t, c)),) * 2
            bo, bs = SIMT_BO, SIMT_BS
            self._smem = (simt_smem(self._acc, 2 * bo * dim + 2 * bs * (dim + 1) + 2 * bs
                                    + 2 * bo * bs),
                          simt_smem(self._acc, 2 * bo * dim + 2 * bs * (dim + 1) + bo * bs))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        attention_host.backward(self.desc, args, self._acc)

    def _run_device(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        delta_kernel, grid, rows, dim = self._delta
        delta = ws.view(self._acc, d.batch * d.lq) if d.lq else args.dq
        if d.lq:
            fn = _SIMT_MODULE.function(delta_kernel, stream.device_id)
            launch(stream, fn, grid, SIMT_THREADS, (args.o, args.dout, delta, rows, dim))
        vec = self._tc and all(backend.data_ptr(a) % 16 == 0
                               for a in (args.q, args.k, args.v, args.dout))
        dkdv, dq = self._kernels[vec]
        common = (args.q, args.k, args.v, args.dout, args.lse, delta)
        launches = ((dkdv, self._grids[0], common + (args.dk, args.dv), 0),
                    (dq, self._grids[1], common + (args.dq,), 1))
        for name, grid, arrays, i in launches:
            if grid == 0:
                continue
            fn = self._module.function(name, stream.device_id)
            allow_dynamic_smem(fn, self._smem[i], stream.device_id)
            launch(stream, fn, grid, self._block,
                   arrays + self._consts[i] + self._scalars + self._rng(args),
                   shared_mem=self._smem[i])

    _run_simt = _run_tensor_core = _run_device


# -- functional API ------------------------------------------------------------------------


def attention_backward(q: Any, k: Any, v: Any, o: Any, lse: Any, dout: Any, *, scale: float,
                       causal: bool = False, dropout: float = 0.0, seed: int = 0,
                       offset: int = 0, heads: tuple[int, int, int] | None = None,
                       kv_group: int = 1) -> tuple[Any, Any, Any]:
    """(dq, dk, dv) of `attention(q, k, v, scale=scale, causal=causal, dropout=dropout,
    seed=seed, offset=offset, heads=heads, kv_group=kv_group)` = (o, lse) for the output
    gradient dout [B, Lq, D]; dk, dv [B // kv_group, Lk, D] sum over each K/V entry's group
    (strided inputs are copied; checked by the plan)."""
    q, k, v, o, lse, dout = contiguous(q, k, v, o, lse, dout)
    desc = AttentionDescriptor(q.shape[0], q.shape[1], k.shape[1], q.shape[-1], scale, causal,
                               q.dtype, dropout, kv_group)
    return call(AttentionBackwardPlan, desc, like=q, q=q, k=k, v=v, o=o, lse=lse, dout=dout,
                seed=seed, offset=offset, **drop_layout(heads))
