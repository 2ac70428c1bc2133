"""Fused causal attention, forward (FlashAttention-2 style): O = softmax(scale * Q K^T) V.

Per batch entry b (batch folds every leading axis, e.g. batch x heads), with S = scale * Q K^T
[Lq, Lk] and key j masked for query i when causal and j > i + (Lk - Lq) (the convention of
the softmax family; equal to PyTorch's for Lq == Lk):

    lse[b, i] = log sum_{j unmasked} exp(S[i, j])          (-inf when every key is masked)
    O[b, i]   = sum_{j unmasked} exp(S[i, j] - lse[b, i]) V[b, j]       (0 for such rows)

The kernels tile Q by rows and stream K/V tiles through shared memory with an online softmax
(running max and sum), so no [Lq, Lk] buffer is ever materialised; `lse` (f32, f64 for f64)
is saved for the backward (attention_backward.py), which recomputes P from Q, K and lse.
scale and causal are fixed per model: descriptor fields shared by forward and backward.

Dropout (field `dropout` = p > 0) drops probability (i, j) of entry b with the keep bit of
flat element (b * Lq + i) * Lk + j of the dropout plan's Philox stream under the call's
(seed, offset) (gpuplan.ops.dropout.plans): exactly the mask `dropout` would draw over the
[B, Lq, Lk] probabilities, so the fused and composed paths drop the same entries:

    O[b, i] = sum_j keep_bij * drop_scale * P[b, i, j] V[b, j],   drop_scale = 1 / (1 - p)

lse stays the undropped softmax's; the backward regenerates the bits from (seed, offset).
A tensor-parallel shard whose batch holds `drop_heads` of every `drop_total_heads` heads of
one process's [outer, total_heads] batch, from head `drop_first_head` on, draws that
process's bits for them: entry b reads as entry (b // heads) * total_heads + first_head +
b % heads (the defaults 1, 1, 0 give b).

Grouped-query attention (field `kv_group` = G = n_head // n_kv_head, default 1): k and v hold
batch // G entries and query entry b reads K/V entry b // G. With batch = outer x n_head
(query head h of outer entry o at b = o n_head + h) and K/V laid out outer x n_kv_head, that
is K/V head h // G of the same outer entry, as Llama's repeat_kv, without K/V ever being
copied per query head. G = 1 is multi-head attention, G = n_head multi-query attention.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, HALF_DTYPES, accumulator, as_dtype, cuda_name, float64
from gpuplan.dtypes import short_name as sn
from gpuplan.errors import InvalidProblem, Unsupported, describe
from gpuplan.execute import call
from gpuplan.nvrtc import CudaModule, allow_dynamic_smem, cdiv, launch
from gpuplan.ops.attention import host as attention_host
from gpuplan.ops.dropout.plans import drop_scale
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import DType, Extent, Flag, In, OpSpec, Out, Real, Scalar
from gpuplan.stream import Stream, Workspace

__all__ = ["AttentionDescriptor", "AttentionArgs", "AttentionPlan"]
__functional__ = ["attention"]

#: Head dims the device kernels take (SIMT: any up to this; tensor cores: TC_HEAD_DIMS).
MAX_HEAD_DIM = 128
TC_HEAD_DIMS = (64, 128)
#: SIMT kernels: chunks of 32 head-dim columns per lane (C in the templates), by head_dim.
SIMT_CHUNKS = (1, 2, 4)
#: SIMT tiles (attention.cu attn::): 4 warps x 4 rows of queries, 32 keys per K/V tile.
SIMT_THREADS, SIMT_BQ, SIMT_BK = 128, 16, 32
#: Tensor-core forward: 4 warps, 64-key tiles, rows padded by 8 halves; tc_rows(head_dim)
#: query rows per CTA.
TC_THREADS, TC_BK, TC_PAD = 128, 64, 8
_MAX_GRID = 2**31 - 1


def tc_rows(head_dim: int) -> int:
    """Query rows per CTA of the tensor-core forward: 4 warps x 16 rows x the row blocks a
    warp owns (attention.cu tc_row_blocks: 2 for head_dim 64, 1 for 128)."""
    return 4 * 16 * (2 if head_dim == 64 else 1)


def simt_chunks(head_dim: int) -> int:
    """C of the SIMT kernels for `head_dim` (each lane holds C columns of a row)."""
    return next(c for c in SIMT_CHUNKS if head_dim <= 32 * c)


def _fwd_simt(t: str, c: int) -> str:
    return f"attn::attention_forward_simt<{t}, {c}>"


def _fwd_tc(t: str, dim: int, vec: bool) -> str:
    return f"attn::attention_forward_tc<{t}, {dim}, {'true' if vec else 'false'}>"


_MODULE = CudaModule(
    __file__,
    "attention.cu",
    [_fwd_simt(cuda_name(t), c) for t in FLOAT_DTYPES for c in SIMT_CHUNKS]
    + [_fwd_tc(cuda_name(t), dim, vec) for t in HALF_DTYPES for dim in TC_HEAD_DIMS
       for vec in (False, True)],
)


# -- the declaration ------------------------------------------------------------------------


def lse_dtype(desc: Any) -> np.dtype:
    """The log-sum-exp's dtype: f64 for f64 inputs, else f32."""
    return float64 if as_dtype(desc.dtype) == float64 else np.dtype(np.float32)


FIELDS = (Extent("batch"), Extent("lq"), Extent("lk"), Extent("head_dim"), Real("scale"),
          Flag("causal", default=False), DType("dtype", FLOAT_DTYPES, default=np.float32),
          Real("dropout", lo=0.0, hi=1.0, default=0.0), Extent("kv_group", min=1, default=1))
#: the dropout stream of a call (as the dropout plan's) and the head layout of its entries:
#: used only when dropout > 0.
RNG = (Scalar("seed", 0, "int", lo=0, hi=2**64, hi_open=True),
       Scalar("offset", 0, "int", lo=0, hi=2**64, hi_open=True),
       Scalar("drop_heads", 1, "int", lo=1, hi=2**31 - 1),
       Scalar("drop_total_heads", 1, "int", lo=1, hi=2**31 - 1),
       Scalar("drop_first_head", 0, "int", lo=0, hi=2**31 - 1))
Q_SHAPE, KV_SHAPE, LSE_SHAPE = ("batch", "lq", "head_dim"), (
    "batch // kv_group", "lk", "head_dim"), ("batch", "lq")
FORWARD = OpSpec(
    "attention", fields=FIELDS,
    operands=(In("q", Q_SHAPE), In("k", KV_SHAPE), In("v", KV_SHAPE), Out("o", Q_SHAPE),
              Out("lse", LSE_SHAPE, lse_dtype)), scalars=RNG)
AttentionDescriptor = FORWARD.descriptor(
    "AttentionDescriptor", "softmax(scale * Q K^T [causal mask]) V over `batch` entries of "
    "q [lq, head_dim], k, v [lk, head_dim]; causal masks key j for query i when "
    "j > i + (lk - lq); dropout drops probabilities with that probability; k and v hold "
    "batch // kv_group entries, query entry b reading entry b // kv_group (grouped-query "
    "attention). Forward and backward share it.")
AttentionArgs = FORWARD.args(
    "AttentionArgs", "q [B, Lq, D], k, v [B // kv_group, Lk, D] in; o [B, Lq, D] and lse "
    "[B, Lq] (f32; f64 for f64) written; seed, offset: the dropout stream, drop_heads, "
    "drop_total_heads, drop_first_head: the batch's head layout in it (dropout > 0 only).")


class _AttentionBase(Plan):
    """What forward and backward share: the SKU choice and the launch constants."""

    category = "attention"
    #: accumulators per query row in the device SKUs' workspace (the backward's delta).
    _ws_per_row = 0

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        if desc.batch % desc.kv_group:
            raise InvalidProblem(describe(cls.op, "kv_group", f"a divisor of batch "
                                          f"({desc.batch}): query heads per K/V head",
                                          desc.kv_group))

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        if desc.head_dim > MAX_HEAD_DIM:
            raise Unsupported(describe(cls.op, "head_dim", f"<= {MAX_HEAD_DIM} on a device",
                                       desc.head_dim))
        acc = accumulator(d)
        ws = cls._ws_per_row * acc.itemsize * desc.batch * desc.lq
        # Every output element is written by one thread of one CTA, sums in a fixed order,
        # no atomics: deterministic. Not bit-stable: exp and the mma summation order are
        # the device's.
        cands = []
        if d in HALF_DTYPES and desc.head_dim in TC_HEAD_DIMS:
            cands.append(Candidate("tensor_core", BackendKind.NVRTC, True, False, sn(d),
                                   sn(acc), ws, min_compute_capability=80))
        cands.append(Candidate("simt", BackendKind.NVRTC, True, False, sn(d), sn(acc), ws))
        return cands

    def _prepare(self) -> None:
        d = self.desc
        self._acc = accumulator(d.dtype)
        self._offset = d.lk - d.lq
        self._t = cuda_name(d.dtype)
        self._chunks = simt_chunks(d.head_dim) if d.head_dim <= MAX_HEAD_DIM else 0
        self._tc = self._cand.variant == "tensor_core"
        self._scalars = (np.float64(d.scale), np.int32(d.causal))
        self._p_drop = np.float32(d.dropout)
        self._drop_scale = drop_scale(d.dropout, d.dtype)

    def _check_args(self, args: Any) -> None:
        heads, total, first = args.drop_heads, args.drop_total_heads, args.drop_first_head
        if first + heads > total:
            raise InvalidProblem(describe(
                self.op, "drop_first_head", f"<= drop_total_heads - drop_heads "
                f"({total} - {heads})", first))
        if self.desc.batch % heads:
            raise InvalidProblem(describe(self.op, "drop_heads",
                                          f"a divisor of batch ({self.desc.batch})", heads))

    def _rng(self, args: Any) -> tuple[Any, ...]:
        """The kernels' trailing dropout arguments (seed, offset, p, drop_scale, head
        layout)."""
        return (np.uint64(args.seed), np.uint64(args.offset), self._p_drop, self._drop_scale,
                np.int64(args.drop_heads), np.int64(args.drop_total_heads),
                np.int64(args.drop_first_head))


def simt_smem(acc: np.dtype, words: int) -> int:
    """Bytes of `words` accumulator elements (the SIMT kernels' shared tiles)."""
    return words * acc.itemsize


def tc_tile_bytes(rows: int, head_dim: int) -> int:
    """Bytes of one padded [rows, head_dim + 8] 2-byte tile."""
    return rows * (head_dim + TC_PAD) * 2


class AttentionPlan(_AttentionBase):
    """(o, lse) = attention(q, k, v) as in the module docstring.

    SKUs on a GPU: ``tensor_core`` (f16/bf16, head_dim 64 or 128, sm_80+): 128 query rows
    per CTA for head_dim 64 (32 per warp, so each K/V fragment read from shared memory feeds
    two mma), 64 for 128 (16 per warp), 64-key K/V tiles double-buffered by cp.async, S = Q
    K^T and O += P V by mma.sync m16n8k16 with f32 accumulators, P kept in registers
    (rounded to the input dtype for the second mma), softmax in the log2 domain. ``simt``
    (every dtype, head_dim <= 128): 16 query rows per CTA (4 per warp), 32-key tiles, one
    key per lane for S and head-dim columns per lane for O; half types accumulate in f32.
    Host: ``numpy`` in the accumulator dtype (gpuplan.ops.attention.host: chunks of batch
    entries, causal row blocks, BLAS GEMMs and compiled float32 softmax kernels).
    """

    op = "attention"
    spec = FORWARD

    def _prepare(self) -> None:
        super()._prepare()
        d = self.desc
        if self._cand.variant == "numpy":
            return
        q_tiles = cdiv(d.lq, tc_rows(d.head_dim) if self._tc else SIMT_BQ)
        self._grid = q_tiles * d.batch
        if self._grid > _MAX_GRID:
            raise Unsupported(describe(self.op, "desc", "at most 2**31 - 1 query tiles",
                                       self._grid))
        self._consts = (np.int64(d.lq), np.int64(d.lk), np.int64(d.head_dim),
                        np.int64(q_tiles), np.int64(d.kv_group))
        if self._tc:
            self._kernels = (_fwd_tc(self._t, d.head_dim, False),
                             _fwd_tc(self._t, d.head_dim, True))
            self._smem = (tc_tile_bytes(tc_rows(d.head_dim), d.head_dim)  # Q
                          + 4 * tc_tile_bytes(TC_BK, d.head_dim))  # 2 x K, 2 x V
            self._block = TC_THREADS
        else:
            self._kernels = (_fwd_simt(self._t, self._chunks),) * 2
            dim = d.head_dim
            self._smem = simt_smem(self._acc, SIMT_BQ * dim + SIMT_BK * (dim + 1)
                                   + SIMT_BK * dim + SIMT_BQ * SIMT_BK)
            self._block = SIMT_THREADS

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        attention_host.forward(self.desc, args, self._acc)

    def _run_device(self, stream: Stream, ws: Workspace, args: Any) -> None:
        vec = self._tc and all(backend.data_ptr(a) % 16 == 0 for a in (args.q, args.k, args.v))
        fn = _MODULE.function(self._kernels[vec], stream.device_id)
        allow_dynamic_smem(fn, self._smem, stream.device_id)
        launch(stream, fn, self._grid, self._block,
               (args.q, args.k, args.v, args.o, args.lse) + self._consts + self._scalars
               + self._rng(args),
               shared_mem=self._smem)

    _run_simt = _run_tensor_core = _run_device


# -- functional API ------------------------------------------------------------------------


def contiguous(*arrays: Any) -> list[Any]:
    """The arrays, strided ones copied to C order (the plans take C-contiguous operands)."""
    return [a if a.flags.c_contiguous else backend.ascontiguous(a) for a in arrays]


def drop_layout(heads: tuple[int, int, int] | None) -> dict[str, int]:
    """The head-layout scalars of `heads` = (drop_heads, drop_total_heads, drop_first_head),
    None for the identity."""
    h = (1, 1, 0) if heads is None else heads
    return dict(drop_heads=h[0], drop_total_heads=h[1], drop_first_head=h[2])


def attention(q: Any, k: Any, v: Any, *, scale: float, causal: bool = False,
              dropout: float = 0.0, seed: int = 0, offset: int = 0,
              heads: tuple[int, int, int] | None = None, kv_group: int = 1
              ) -> tuple[Any, Any]:
    """(o [B, Lq, D], lse [B, Lq]) of q [B, Lq, D], k, v [B // kv_group, Lk, D] (query entry
    b attends with K/V entry b // kv_group: grouped-query attention; strided inputs are
    copied; shapes and dtypes are checked by the plan); dropout > 0 drops probabilities with
    the Philox stream (seed, offset) as `dropout` over [B, Lq, Lk] would (`heads`: the
    batch's head layout, module docstring)."""
    q, k, v = contiguous(q, k, v)
    desc = AttentionDescriptor(q.shape[0], q.shape[1], k.shape[1], q.shape[-1], scale, causal,
                               q.dtype, dropout, kv_group)
    return call(AttentionPlan, desc, like=q, q=q, k=k, v=v, seed=seed, offset=offset,
                **drop_layout(heads))
