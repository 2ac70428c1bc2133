"""Reductions along one dim that keep positions: max/min with their indices (arg_select) and
the k largest or smallest (topk).

x is viewed as [outer, length, inner] (the dim has `length` elements, stride `inner`); the
whole tensor is [1, size, 1]. Selection order (torch's): NaN first (the first NaN wins), then
the largest (max, largest top-k) or smallest values, equal values by ascending index.

    arg_select:    values[o, i], indices[o, i] = first of x[o, :, i] in that order
    topk:          values[o, s, i], indices[o, s, i] for the first k in that order

Every kernel's order of combination depends on the problem alone: deterministic, bit-stable.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name
from gpuplan.dtypes import short_name as sn
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.ops.reduction.launch import dim_view, kept_shape
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import Choice, DType, Extent, Flag, In, OpSpec, Out
from gpuplan.stream import Stream, Workspace

__all__ = ["ArgSelectDescriptor", "ArgSelectArgs", "ArgSelectPlan", "TopkDescriptor", "TopkArgs",
           "TopkPlan"]
__functional__ = ["arg_select", "topk"]

#: enum Select of reduce_dim.cu: "max" selects the largest, "min" the smallest.
SELECTS: tuple[str, ...] = ("max", "min")
_MAX_DIMS = 8
_MAX_GRID = 1 << 18
_I64 = np.dtype(np.int64)

MODULE = CudaModule(
    __file__, "reduce_dim.cu",
    [f"arg_select<{cuda_name(t)}, {s}, {tpr}>" for t in FLOAT_DTYPES
     for s in range(len(SELECTS)) for tpr in (1, 32)]
    + [f"topk_select<{cuda_name(t)}, {s}>" for t in FLOAT_DTYPES for s in range(len(SELECTS))],
    enums={"Select": tuple(f"sel_{s}" for s in SELECTS)},
)

_ROW = (Extent("outer"), Extent("length"), Extent("inner"))
_DTYPE = DType("dtype", FLOAT_DTYPES, default=np.float32)
_X = In("x", ("outer", "length", "inner"))


def _host_order(x: np.ndarray, largest: bool) -> np.ndarray:
    """Positions along axis 1 of x [outer, length, inner] sorted in the selection order."""
    v = np.moveaxis(x, 1, -1)
    nan = np.isnan(v)
    key = np.where(nan, 0, v)
    pos = np.broadcast_to(np.arange(v.shape[-1]), v.shape)
    # np.lexsort: the last key is the primary one. NaN first, then by value, then position.
    order = np.lexsort((pos, -key if largest else key, ~nan), axis=-1)
    return np.moveaxis(order, -1, 1)


# -- max/min with indices -------------------------------------------------------------------

ARG_SELECT = OpSpec(
    "arg_select",
    fields=(Choice("op", SELECTS), *_ROW, _DTYPE),
    operands=(_X, Out("values", ("outer", "inner")),
              Out("indices", ("outer", "inner"), dtype=_I64)),
)
ArgSelectDescriptor = ARG_SELECT.descriptor(
    "ArgSelectDescriptor", "values, indices [outer, inner] of the max or min of x[o, :, i] "
    "(x [outer, length, inner]); NaN wins, ties go to the lowest index.")
ArgSelectArgs = ARG_SELECT.args("ArgSelectArgs", "x, values (x's dtype), indices (int64).")


class ArgSelectPlan(Plan):
    """max/min with their positions. GPU SKUs: ``rows`` (inner == 1 and rows of >= 64: a warp
    per output) and ``cols`` (a thread per output walks its column; adjacent threads read
    adjacent elements when inner > 1). Exact: deterministic and bit-stable."""

    op = "arg_select"
    category = "reduction"
    spec = ARG_SELECT

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        if desc.length == 0 and desc.outer * desc.inner > 0:
            raise InvalidProblem(describe(cls.op, "length", f"a non-empty dim for {desc.op}", 0))

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        kind = "rows" if desc.inner == 1 and desc.length >= 64 else "cols"
        return [Candidate(kind, BackendKind.NVRTC, True, True, sn(d), sn(accumulator(d)))]

    def _prepare(self) -> None:
        d = self.desc
        tpr = 32 if self._cand.variant == "rows" else 1
        self._kernel = f"arg_select<{cuda_name(d.dtype)}, {SELECTS.index(d.op)}, {tpr}>"
        self._grid = max(1, min(cdiv(d.outer * d.inner * tpr, 256), _MAX_GRID))
        self._extents = (np.int64(d.outer), np.int64(d.length), np.int64(d.inner))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        x = args.x.astype(accumulator(self.desc.dtype), copy=False)
        # np.argmax/argmin return the first maximum, and the first NaN when there is one.
        idx = (np.argmax if self.desc.op == "max" else np.argmin)(x, axis=1)
        args.indices[...] = idx
        args.values[...] = np.take_along_axis(args.x, idx[:, None, :], axis=1)[:, 0, :]

    def _run_device(self, stream: Stream, ws: Workspace, args: Any) -> None:
        launch(stream, MODULE.function(self._kernel, stream.device_id), self._grid, 256,
               (args.x, args.values, args.indices, *self._extents))

    _run_rows = _run_cols = _run_device


# -- top-k ------------------------------------------------------------------------------------

TOPK = OpSpec(
    "topk",
    fields=(*_ROW, Extent("k"), Flag("largest", default=True), _DTYPE),
    operands=(_X, Out("values", ("outer", "k", "inner")),
              Out("indices", ("outer", "k", "inner"), dtype=_I64)),
)
TopkDescriptor = TOPK.descriptor(
    "TopkDescriptor", "values, indices [outer, k, inner]: the k largest (smallest) of "
    "x[o, :, i] (x [outer, length, inner]) in order; NaN first, ties by ascending index.")
TopkArgs = TOPK.args("TopkArgs", "x, values (x's dtype), indices (int64).")


class TopkPlan(Plan):
    """Top k along the dim, sorted. GPU SKU ``select``: a block per (o, i) makes k passes over
    its column, each selecting the next element in order (O(k * length) reads per column:
    meant for k up to a few hundred; a large k on long rows is slow, not wrong). Exact."""

    op = "topk"
    category = "reduction"
    spec = TOPK

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        if desc.k > desc.length:
            raise InvalidProblem(describe(cls.op, "k", f"k <= the dim's length {desc.length}",
                                          desc.k))

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        return [Candidate("select", BackendKind.NVRTC, True, True, sn(d), sn(accumulator(d)))]

    def _prepare(self) -> None:
        d = self.desc
        self._kernel = f"topk_select<{cuda_name(d.dtype)}, {0 if d.largest else 1}>"
        self._grid = max(1, min(d.outer * d.inner, _MAX_GRID))
        self._extents = (np.int64(d.outer), np.int64(d.length), np.int64(d.inner), np.int64(d.k))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        x = args.x.astype(accumulator(self.desc.dtype), copy=False)
        idx = _host_order(x, self.desc.largest)[:, :self.desc.k, :]
        args.indices[...] = idx
        args.values[...] = np.take_along_axis(args.x, idx, axis=1)

    def _run_select(self, stream: Stream, ws: Workspace, args: Any) -> None:
        launch(stream, MODULE.function(self._kernel, stream.device_id), self._grid, 256,
               (args.x, args.values, args.indices, *self._extents))


# -- functional API ------------------------------------------------------------------------------


def arg_select(op: str, x: Any, dim: int | None = None, keepdim: bool = False
               ) -> tuple[Any, Any]:
    """(values, int64 indices) of the max or min of x along `dim` (None: all elements, the
    index into the flattened tensor)."""
    o, n, i = dim_view("arg_select", x.shape, dim)
    vals, idx = call(ArgSelectPlan, ArgSelectDescriptor(op, o, n, i, x.dtype), like=x,
                     x=backend.ascontiguous(x).reshape(o, n, i))
    shape = kept_shape(tuple(x.shape), dim, keepdim)
    return vals.reshape(shape), idx.reshape(shape)


def topk(x: Any, k: int, dim: int = -1, largest: bool = True) -> tuple[Any, Any]:
    """(values, int64 indices): the k largest (smallest) entries along `dim`, in order."""
    o, n, i = dim_view("topk", x.shape, dim)
    vals, idx = call(TopkPlan, TopkDescriptor(o, n, i, k, bool(largest), x.dtype), like=x,
                     x=backend.ascontiguous(x).reshape(o, n, i))
    shape = list(x.shape) or [1]
    shape[int(dim) % len(shape)] = k
    return vals.reshape(tuple(shape[:x.ndim])), idx.reshape(tuple(shape[:x.ndim]))
