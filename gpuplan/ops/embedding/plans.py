"""Embedding lookup (gather) and its backward (scatter-add into the weight gradient).

Entry n looks up row r_n = indices[n] - index_offset (index_offset: where this table's
block starts in the caller's index space, 0 for a whole table; a vocab-parallel shard
passes its first vocabulary id).
Forward:  out[n, :] = weight[r_n, :], a zero row where r_n is outside [0, V).
Backward: dweight[r_n, :] += dout[n, :], skipping entries whose r_n is outside [0, V) and
those with indices[n] == padding_idx (padding_idx is in the caller's, unshifted, space).
The caller zeroes dweight (or passes a running gradient to add to).
The index dtype (int32 or int64) is taken from the `indices` array.
On the host, a float32 backward runs the compiled scatter-add of gpuplan.host_kernels_sums
(the NumPy segment sums' bits) where numba is present.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend, host_jit
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, cuda_name, float32, float64, short_name
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.nvrtc import CudaModule, launch, on_stream
from gpuplan.plan import BackendKind, Candidate, Plan, PlanPreference, host_candidate
from gpuplan.spec import INDEX, DType, Extent, In, Index, InOut, OpSpec, Out
from gpuplan.stream import Stream, Workspace

__all__ = [
    "EmbeddingDescriptor",
    "EmbeddingArgs",
    "EmbeddingPlan",
    "EmbeddingBackwardDescriptor",
    "EmbeddingBackwardArgs",
    "EmbeddingBackwardPlan",
]
__functional__ = ["embedding", "embedding_backward"]

#: index dtype (as `Resolved.check` names it) -> CUDA type of the kernels' I parameter.
_INDEX_CTYPES = {"i32": "int", "i64": "long long"}
_MODULE = CudaModule(
    __file__,
    "embedding.cu",
    [f"embedding_forward<{cuda_name(t)}, {i}>" for t in FLOAT_DTYPES
     for i in _INDEX_CTYPES.values()]
    + [f"embedding_backward_atomic<{cuda_name(t)}, {i}>" for t in (float32, float64)
       for i in _INDEX_CTYPES.values()]
    + [f"embedding_backward_segment<{cuda_name(t)}, {i}>" for t in FLOAT_DTYPES
       for i in _INDEX_CTYPES.values()],
)

_EXTENTS = (Extent("num_embeddings"), Extent("embedding_dim"), Extent("num_indices"))
_DTYPE = DType("dtype", FLOAT_DTYPES, default=np.float32)
_OFFSET = Index("index_offset", default=0)
_INDICES = In("indices", ("num_indices",), INDEX)
_ROWS = ("num_indices", "embedding_dim")
_TABLE = ("num_embeddings", "embedding_dim")

FORWARD = OpSpec(
    "embedding", fields=(*_EXTENTS, _DTYPE, _OFFSET),
    operands=(In("weight", _TABLE), _INDICES, Out("out", _ROWS)),
)  # empty: out has no element (N == 0 or D == 0); V == 0 writes zero rows
BACKWARD = OpSpec(
    "embedding_backward",
    fields=(*_EXTENTS, Index("padding_idx", default=None), _DTYPE, _OFFSET),
    operands=(In("dout", _ROWS), _INDICES, InOut("dweight", _TABLE, distinct=("dout", "indices"))),
    empty=("num_indices", "embedding_dim", "num_embeddings"),
)

EmbeddingDescriptor = FORWARD.descriptor(
    "EmbeddingDescriptor", "weight [num_embeddings, embedding_dim] gathered by "
                           "indices [num_indices] - index_offset into out "
                           "[num_indices, embedding_dim].")
EmbeddingArgs = FORWARD.args(
    "EmbeddingArgs", "weight [V, D], indices [N] (int32 or int64), out [N, D] (written).")
EmbeddingBackwardDescriptor = BACKWARD.descriptor(
    "EmbeddingBackwardDescriptor", "dout [num_indices, embedding_dim] scatter-added into "
                                   "dweight [num_embeddings, embedding_dim] at rows indices "
                                   "- index_offset; entries whose index is padding_idx "
                                   "(unshifted; None: no padding) are skipped.")
EmbeddingBackwardArgs = BACKWARD.args(
    "EmbeddingBackwardArgs", "dout [N, D], indices [N] (int32 or int64), dweight [V, D] "
                             "(accumulated into: the caller zeroes it).")


def _kernels(template: str, dtype: Any) -> dict[str, str]:
    """Kernel name per index dtype ('i32', 'i64') for one dtype."""
    return {k: f"{template}<{cuda_name(dtype)}, {c}>" for k, c in _INDEX_CTYPES.items()}


def _launch_shape(n: int, d: int) -> tuple[int, int]:
    """(grid, threads): one block per row (grid-stride past 65535 * 8), threads over D."""
    return int(min(n, 65535 * 8)), int(min(256, max(32, -(-d // 32) * 32)))


def _shifted_rows(idx: np.ndarray, offset: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, valid): rows = idx - offset, valid where that lies in [0, v). As the kernels
    do, the difference is taken in uint64 and trusted only where idx >= offset: exact for
    every int64 index and offset (no overflow)."""
    if not offset:
        return idx, (idx >= 0) & (idx < v)
    diff = idx.astype(np.uint64) - np.uint64(offset % 2**64)
    return diff.view(np.int64), (idx >= offset) & (diff < np.uint64(v))


class EmbeddingPlan(Plan):
    """Gather rows of `weight`; out-of-range indices give zero rows (never an OOB read)."""

    op = "embedding"
    category = "gather"
    spec = FORWARD

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        if stream.is_host:
            return [host_candidate(desc.dtype)]
        # A gather does no arithmetic: exact, deterministic and bit-stable.
        d = short_name(desc.dtype)
        return [Candidate("gather", BackendKind.NVRTC, True, True, d, d)]

    def _prepare(self) -> None:
        d = self.desc
        self._kernel = _kernels("embedding_forward", d.dtype)
        self._launch_dims = _launch_shape(d.num_indices, d.embedding_dim)
        self._extents = (np.int64(d.num_indices), np.int64(d.num_embeddings),
                         np.int64(d.embedding_dim), np.int64(d.index_offset))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        if d.num_embeddings == 0:
            args.out[...] = 0
            return
        idx, valid = _shifted_rows(args.indices, d.index_offset, d.num_embeddings)
        if valid.all():
            np.take(args.weight, idx, axis=0, out=args.out)
            return
        args.out[...] = args.weight[np.where(valid, idx, 0)]
        args.out[~valid] = 0

    def _run_gather(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = _MODULE.function(self._kernel[self._index_dtype], stream.device_id)
        launch(stream, fn, *self._launch_dims,
               (args.weight, args.indices, args.out, *self._extents))


class EmbeddingBackwardPlan(Plan):
    """Scatter-add `dout` rows into `dweight`.

    SKUs on a GPU: ``atomic`` (f32/f64, fastest, order of additions unspecified) and
    ``segment`` (every dtype; stable sort by index, each row's contributions summed in
    ascending n in the accumulator type and added once: deterministic and bit-stable,
    and bit-identical to the NumPy implementation). `PlanPreference(deterministic=True)`
    selects ``segment``; f16/bf16 always use it.
    """

    op = "embedding_backward"
    category = "scatter"
    spec = BACKWARD

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        if stream.is_host:
            return [host_candidate(desc.dtype)]
        d, acc = short_name(desc.dtype), short_name(accumulator(desc.dtype))
        cands = []
        if d in ("f32", "f64"):
            cands.append(Candidate("atomic", BackendKind.NVRTC, False, False, d, acc))
        cands.append(Candidate("segment", BackendKind.NVRTC, True, True, d, acc))
        return cands

    def _prepare(self) -> None:
        d = self.desc
        self._acc = accumulator(d.dtype)
        self._kernel = _kernels(f"embedding_backward_{self._cand.variant}", d.dtype)
        self._launch_dims = _launch_shape(d.num_indices, d.embedding_dim)
        # The kernels compare rows: padding_idx's row in this table, or -1 (never a valid
        # row) when there is none or it falls outside [0, V) after the shift.
        pad = None if d.padding_idx is None else int(d.padding_idx) - int(d.index_offset)
        self._padding_row = pad if pad is not None and 0 <= pad < d.num_embeddings else -1
        self._extents = (np.int64(d.num_indices), np.int64(d.num_embeddings),
                         np.int64(d.embedding_dim), np.int64(self._padding_row),
                         np.int64(d.index_offset))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        shifted, valid = _shifted_rows(args.indices, d.index_offset, d.num_embeddings)
        idx = shifted.astype(np.int64, copy=False)
        keep = valid & (idx != self._padding_row)
        k = (host_jit.extra("host_kernels_sums")
             if host_jit.takes(args.dout, args.dweight) else None)
        if k is not None:
            k.embedding_backward(args.dout.reshape(-1, d.embedding_dim), idx.reshape(-1),
                                 keep.reshape(-1), args.dweight)
            return
        rows = np.nonzero(keep)[0]
        if rows.size == 0:
            return
        # Same order of additions as the segment kernel: ascending n per row, in the
        # accumulator dtype, then one add into dweight.
        order = rows[np.argsort(idx[rows], kind="stable")]
        sidx = idx[order]
        starts = np.concatenate(([0], np.nonzero(np.diff(sidx))[0] + 1))
        sums = _sequential_segment_sum(args.dout[order].astype(self._acc), starts)
        targets = sidx[starts]
        args.dweight[targets] = (args.dweight[targets].astype(self._acc) + sums).astype(d.dtype)

    def _run_atomic(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = _MODULE.function(self._kernel[self._index_dtype], stream.device_id)
        launch(stream, fn, *self._launch_dims,
               (args.dout, args.indices, args.dweight, *self._extents))

    def _run_segment(self, stream: Stream, ws: Workspace, args: Any) -> None:
        xp = backend.array_namespace(args.indices)
        with on_stream(stream):
            # A stable sort (CuPy's default; NumPy's "stable"): equal indices keep ascending n.
            kind = "stable" if stream.is_emulated else None
            order = xp.argsort(args.indices, kind=kind).astype(np.int64, copy=False)
            sorted_idx = args.indices[order]
        fn = _MODULE.function(self._kernel[self._index_dtype], stream.device_id)
        launch(stream, fn, *self._launch_dims,
               (args.dout, order, sorted_idx, args.dweight, *self._extents))


def _sequential_segment_sum(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sum rows of x per segment strictly left to right from zero, as the segment kernel
    does (np.add.reduceat is not sequential over axis 0: its bits differ from the kernel's).

    Vectorized across segments: step j adds row j of every segment longer than j.
    """
    lengths = np.diff(starts, append=x.shape[0])
    by_length = np.argsort(-lengths, kind="stable")
    first, lens = starts[by_length], lengths[by_length]
    acc = np.zeros((starts.size,) + x.shape[1:], dtype=x.dtype)
    live = starts.size
    for j in range(int(lens[0]) if lens.size else 0):
        while live and lens[live - 1] <= j:
            live -= 1
        acc[:live] += x[first[:live] + j]
    sums = np.empty_like(acc)
    sums[by_length] = acc
    return sums


# -- functional API ------------------------------------------------------------------------

_DESCRIPTORS: dict[tuple, Any] = {}


def _descriptor(cls: type, *fields: Any) -> Any:
    """cls(*fields), remembered: building a frozen descriptor costs as much as the plan
    lookup, and a training loop asks for the same few on every step."""
    key = (cls, *fields)
    desc = _DESCRIPTORS.get(key)
    if desc is None:
        if len(_DESCRIPTORS) >= 1024:
            _DESCRIPTORS.clear()
        desc = _DESCRIPTORS[key] = cls(*fields)
    return desc


def embedding(weight: Any, indices: Any, index_offset: int = 0) -> Any:
    """out[..., :] = weight[indices[...] - index_offset, :] (zero rows outside the table) for
    indices of any shape: indices.shape + (D,)."""
    flat = indices if indices.ndim == 1 else indices.reshape(-1)
    try:  # free when right: a wrong rank is named instead of Python's unpacking error
        v, dim = weight.shape
    except ValueError:
        raise InvalidProblem(describe("embedding", "weight", "a rank-2 array [V, D]",
                                      f"shape {tuple(weight.shape)}")) from None
    out = call(EmbeddingPlan, _descriptor(EmbeddingDescriptor, v, dim, flat.shape[0],
                                          weight.dtype, index_offset),
               like=weight, weight=weight, indices=flat)
    return out if flat is indices else out.reshape(indices.shape + (dim,))


def embedding_backward(dout: Any, indices: Any, num_embeddings: int,
                       padding_idx: int | None = None, deterministic: bool = False,
                       index_offset: int = 0) -> Any:
    """dweight [num_embeddings, D] (fresh zeros) with dweight[indices[n] - index_offset] +=
    dout[n], skipping rows outside the table and entries with indices[n] == padding_idx."""
    dim = dout.shape[-1]
    flat_idx = indices if indices.ndim == 1 else indices.reshape(-1)
    dweight = backend.array_namespace(dout).zeros((num_embeddings, dim), dtype=dout.dtype)
    desc = _descriptor(EmbeddingBackwardDescriptor, num_embeddings, dim, flat_idx.shape[0],
                       padding_idx, dout.dtype, index_offset)
    call(EmbeddingBackwardPlan, desc, like=dout, dout=dout.reshape(-1, dim), indices=flat_idx,
         dweight=dweight, pref=_PREFERENCES[bool(deterministic)])
    return dweight


_PREFERENCES = {flag: PlanPreference(deterministic=flag) for flag in (False, True)}
