"""Embedding lookup (gather) and its backward (scatter-add into the weight gradient).

Forward:  out[n, :] = weight[indices[n], :], a zero row where indices[n] is outside [0, V).
Backward: dweight[indices[n], :] += dout[n, :], skipping rows whose index is padding_idx,
negative or >= V. The caller zeroes dweight (or passes a running gradient to add to).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, cuda_name, float32, float64, short_name
from gpuplan.execute import execute
from gpuplan.nvrtc import CudaModule, launch, on_stream
from gpuplan.plan import (
    BackendKind,
    Candidate,
    Plan,
    PlanPreference,
    check_dtype,
    check_index_dtype,
    check_operand,
    check_writable_distinct,
    host_candidate,
)
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

_INDEX_TYPES = ("int", "long long")
_MODULE = CudaModule(
    __file__,
    "embedding.cu",
    [f"embedding_forward<{cuda_name(t)}, {i}>" for t in FLOAT_DTYPES for i in _INDEX_TYPES]
    + [f"embedding_backward_atomic<{cuda_name(t)}, {i}>" for t in (float32, float64)
       for i in _INDEX_TYPES]
    + [f"embedding_backward_segment<{cuda_name(t)}, {i}>" for t in FLOAT_DTYPES
       for i in _INDEX_TYPES],
)


def _index_ctype(indices: Any) -> str:
    return "int" if indices.dtype == np.int32 else "long long"


def _threads_for(d: int) -> int:
    return int(min(256, max(32, -(-d // 32) * 32)))


def _grid_rows(n: int) -> int:
    return int(min(n, 65535 * 8))


@dataclass(frozen=True)
class EmbeddingDescriptor:
    num_embeddings: int
    embedding_dim: int
    num_indices: int
    dtype: Any = np.float32


@dataclass(frozen=True)
class EmbeddingArgs:
    weight: Any   # [num_embeddings, embedding_dim]
    indices: Any  # [num_indices], int32 or int64
    out: Any      # [num_indices, embedding_dim]


class EmbeddingPlan(Plan):
    """Gather rows of `weight`; out-of-range indices give zero rows (never an OOB read)."""

    op = "embedding"
    category = "gather"

    @classmethod
    def _candidates(cls, desc: EmbeddingDescriptor, on_device: bool) -> list[Candidate]:
        d = check_dtype(cls.op, "dtype", desc.dtype, FLOAT_DTYPES)
        if not on_device:
            return [host_candidate(d)]
        # A gather does no arithmetic: exact, deterministic and bit-stable.
        return [Candidate("gather", BackendKind.NVRTC, True, True, short_name(d), short_name(d))]

    def _check_args(self, args: EmbeddingArgs) -> None:
        d = self.desc
        check_operand(self.op, "weight", args.weight, (d.num_embeddings, d.embedding_dim), d.dtype)
        self._index_dtype = short_name(check_index_dtype(self.op, "indices", args.indices))
        check_operand(self.op, "indices", args.indices, (d.num_indices,), args.indices.dtype)
        check_operand(self.op, "out", args.out, (d.num_indices, d.embedding_dim), d.dtype)
        check_writable_distinct(self.op, {"out": args.out},
                                {"weight": args.weight, "indices": args.indices})

    def _is_empty(self) -> bool:
        return self.desc.num_indices == 0 or self.desc.embedding_dim == 0

    def _run_numpy(self, stream: Stream, ws: Workspace, args: EmbeddingArgs) -> None:
        idx = args.indices.astype(np.int64)
        valid = (idx >= 0) & (idx < self.desc.num_embeddings)
        if self.desc.num_embeddings == 0:
            args.out[...] = 0
            return
        rows = args.weight[np.where(valid, idx, 0)]
        rows[~valid] = 0
        args.out[...] = rows

    def _run_gather(self, stream: Stream, ws: Workspace, args: EmbeddingArgs) -> None:
        d = self.desc
        fn = _MODULE.function(
            f"embedding_forward<{cuda_name(d.dtype)}, {_index_ctype(args.indices)}>",
            stream.device_id)
        launch(stream, fn, _grid_rows(d.num_indices), _threads_for(d.embedding_dim),
               (args.weight, args.indices, args.out, np.int64(d.num_indices),
                np.int64(d.num_embeddings), np.int64(d.embedding_dim)))


@dataclass(frozen=True)
class EmbeddingBackwardDescriptor:
    num_embeddings: int
    embedding_dim: int
    num_indices: int
    padding_idx: int | None = None
    dtype: Any = np.float32


@dataclass(frozen=True)
class EmbeddingBackwardArgs:
    dout: Any     # [num_indices, embedding_dim]
    indices: Any  # [num_indices], int32 or int64
    dweight: Any  # [num_embeddings, embedding_dim], accumulated into


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

    @classmethod
    def _candidates(cls, desc: EmbeddingBackwardDescriptor, on_device: bool) -> list[Candidate]:
        d = check_dtype(cls.op, "dtype", desc.dtype, FLOAT_DTYPES)
        acc = short_name(accumulator(d))
        if not on_device:
            return [host_candidate(d)]
        cands = []
        if d in (float32, float64):
            cands.append(Candidate("atomic", BackendKind.NVRTC, False, False, short_name(d), acc))
        cands.append(Candidate("segment", BackendKind.NVRTC, True, True, short_name(d), acc))
        return cands

    def _check_args(self, args: EmbeddingBackwardArgs) -> None:
        d = self.desc
        check_operand(self.op, "dout", args.dout, (d.num_indices, d.embedding_dim), d.dtype)
        self._index_dtype = short_name(check_index_dtype(self.op, "indices", args.indices))
        check_operand(self.op, "indices", args.indices, (d.num_indices,), args.indices.dtype)
        check_operand(self.op, "dweight", args.dweight, (d.num_embeddings, d.embedding_dim),
                      d.dtype)
        check_writable_distinct(self.op, {"dweight": args.dweight},
                                {"dout": args.dout, "indices": args.indices})

    def _is_empty(self) -> bool:
        d = self.desc
        return d.num_indices == 0 or d.embedding_dim == 0 or d.num_embeddings == 0

    def _padding(self) -> int:
        p = self.desc.padding_idx
        # -1 never matches a valid row, and negative indices are skipped anyway.
        return -1 if p is None else int(p)

    def _run_numpy(self, stream: Stream, ws: Workspace, args: EmbeddingBackwardArgs) -> None:
        d = self.desc
        idx = args.indices.astype(np.int64)
        keep = (idx >= 0) & (idx < d.num_embeddings) & (idx != self._padding())
        rows = np.nonzero(keep)[0]
        if rows.size == 0:
            return
        # Same order of additions as the segment kernel: ascending n per row, in the
        # accumulator dtype, then one add into dweight.
        order = rows[np.argsort(idx[rows], kind="stable")]
        sidx = idx[order]
        starts = np.concatenate(([0], np.nonzero(np.diff(sidx))[0] + 1))
        acc_t = accumulator(d.dtype)
        contrib = args.dout[order].astype(acc_t)
        sums = _sequential_segment_sum(contrib, starts)
        targets = sidx[starts]
        args.dweight[targets] = (args.dweight[targets].astype(acc_t) + sums).astype(d.dtype)

    def _run_atomic(self, stream: Stream, ws: Workspace, args: EmbeddingBackwardArgs) -> None:
        d = self.desc
        fn = _MODULE.function(
            f"embedding_backward_atomic<{cuda_name(d.dtype)}, {_index_ctype(args.indices)}>",
            stream.device_id)
        launch(stream, fn, _grid_rows(d.num_indices), _threads_for(d.embedding_dim),
               (args.dout, args.indices, args.dweight, np.int64(d.num_indices),
                np.int64(d.num_embeddings), np.int64(d.embedding_dim), np.int64(self._padding())))

    def _run_segment(self, stream: Stream, ws: Workspace, args: EmbeddingBackwardArgs) -> None:
        d = self.desc
        xp = backend.array_namespace(args.indices)
        with on_stream(stream):
            # A stable sort (CuPy's default; NumPy's "stable"): equal indices keep ascending n.
            kind = "stable" if backend.is_emulated_array(args.indices) else None
            order = xp.argsort(args.indices, kind=kind).astype(np.int64, copy=False)
            sorted_idx = args.indices[order]
        fn = _MODULE.function(
            f"embedding_backward_segment<{cuda_name(d.dtype)}, {_index_ctype(args.indices)}>",
            stream.device_id)
        launch(stream, fn, _grid_rows(d.num_indices), _threads_for(d.embedding_dim),
               (args.dout, order, sorted_idx, args.dweight, np.int64(d.num_indices),
                np.int64(d.num_embeddings), np.int64(d.embedding_dim), np.int64(self._padding())))


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


def embedding(weight: Any, indices: Any) -> Any:
    """out[n, :] = weight[indices[n], :] for indices of any shape: returns indices.shape + [D]."""
    flat = indices.reshape(-1)
    v, dim = weight.shape
    out = backend.array_namespace(weight).empty((flat.shape[0], dim), dtype=weight.dtype)
    desc = EmbeddingDescriptor(int(v), int(dim), int(flat.shape[0]), weight.dtype)
    execute(EmbeddingPlan, desc, EmbeddingArgs(weight, flat, out), like=weight)
    return out.reshape(tuple(indices.shape) + (int(dim),))


def embedding_backward(dout: Any, indices: Any, num_embeddings: int,
                       padding_idx: int | None = None, deterministic: bool = False) -> Any:
    """dweight [num_embeddings, D] (fresh zeros) with dweight[indices[n]] += dout[n]."""
    dim = int(dout.shape[-1])
    flat_idx = indices.reshape(-1)
    flat_dout = dout.reshape(-1, dim)
    dweight = backend.array_namespace(dout).zeros((num_embeddings, dim), dtype=dout.dtype)
    desc = EmbeddingBackwardDescriptor(int(num_embeddings), dim, int(flat_idx.shape[0]),
                                       padding_idx, dout.dtype)
    execute(EmbeddingBackwardPlan, desc, EmbeddingBackwardArgs(flat_dout, flat_idx, dweight),
            like=dout, pref=PlanPreference(deterministic=deterministic))
    return dweight
