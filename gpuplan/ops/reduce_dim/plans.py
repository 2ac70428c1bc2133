"""Reductions along one dim that keep positions (max/min with indices, top-k), the variance
(and standard deviation) over axes, and the gradient of a product along one dim.

x is viewed as [outer, length, inner] (the dim has `length` elements, stride `inner`); the
whole tensor is [1, size, 1]. Selection order (torch's): NaN first (the first NaN wins), then
the largest (max, largest top-k) or smallest values, equal values by ascending index.

    arg_select:    values[o, i], indices[o, i] = first of x[o, :, i] in that order
    topk:          values[o, s, i], indices[o, s, i] for the first k in that order
    variance:      sum((x - mean)^2) / max(0, n - correction) over axes (std: its sqrt)
    prod_backward: dx[o, r, i] = dy[o, i] * prod_{r' != r} x[o, r', i] (zeros handled exactly)

Every kernel's order of combination depends on the problem alone: deterministic, bit-stable.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name
from gpuplan.dtypes import short_name as sn
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.ops.reduction.launch import normalize_axes, reduce_layout
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import Choice, DType, Extent, Flag, In, OpSpec, Out, Real, Shape, Value
from gpuplan.stream import Stream, Workspace

__all__ = [f"{op}{kind}" for op in ("ArgSelect", "Topk", "Variance", "ProdBackward")
           for kind in ("Descriptor", "Args", "Plan")]
__functional__ = ["arg_select", "topk", "variance", "prod_backward"]

#: enum Select of reduce_dim.cu: "max" selects the largest, "min" the smallest.
SELECTS: tuple[str, ...] = ("max", "min")
_MAX_DIMS = 8
_MAX_GRID = 1 << 18
_I64 = np.dtype(np.int64)

MODULE = CudaModule(
    __file__, "reduce_dim.cu",
    [f"arg_select<{cuda_name(t)}, {s}, {tpr}>" for t in FLOAT_DTYPES
     for s in range(len(SELECTS)) for tpr in (1, 32)]
    + [f"topk_select<{cuda_name(t)}, {s}>" for t in FLOAT_DTYPES for s in range(len(SELECTS))]
    + [f"variance_general<{cuda_name(t)}, {std}>" for t in FLOAT_DTYPES for std in (0, 1)]
    + [f"prod_backward<{cuda_name(t)}>" for t in FLOAT_DTYPES],
    enums={"Select": tuple(f"sel_{s}" for s in SELECTS)},
)

_ROW = (Extent("outer"), Extent("length"), Extent("inner"))
_DTYPE = DType("dtype", FLOAT_DTYPES, default=np.float32)
_X = In("x", ("outer", "length", "inner"))


def _grid(n: int) -> int:
    return max(1, min(cdiv(n, 256), _MAX_GRID))


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


# -- variance / standard deviation ------------------------------------------------------------


def _var_axes(desc: Any) -> tuple[int, ...]:
    return normalize_axes("variance", tuple(desc.shape), desc.axes)


def _var_out_shape(desc: Any) -> tuple[int, ...]:
    axes = _var_axes(desc)
    if desc.keepdims:
        return tuple(1 if i in axes else int(e) for i, e in enumerate(desc.shape))
    return tuple(int(e) for i, e in enumerate(desc.shape) if i not in axes)


VARIANCE = OpSpec(
    "variance",
    fields=(Shape("shape"), Value("axes", default=None), Flag("keepdims", default=False),
            Real("correction", lo=0.0, default=1.0), Flag("std", default=False), _DTYPE),
    operands=(In("x", lambda d: tuple(d.shape)), Out("y", _var_out_shape)),
)
VarianceDescriptor = VARIANCE.descriptor(
    "VarianceDescriptor", "y = sum((x - mean)^2) / max(0, n - correction) over axes (n "
    "elements each); with std, its square root. axes/keepdims as in ReduceDescriptor.")
VarianceDescriptor.out_shape = _var_out_shape
VarianceArgs = VARIANCE.args("VarianceArgs", "x [shape], y [desc.out_shape()].")


def _general_dims(shape: tuple, axes: tuple) -> tuple[tuple, tuple, int]:
    """(extents, element strides, number of kept dims) of x viewed as kept dims then reduced
    dims, neighbours of the same kind merged (reduce_layout's merge)."""
    lay = reduce_layout(shape, frozenset(axes))
    if lay.kind == "general":
        return lay.dims
    if lay.kind == "rows":
        rows, cols = lay.dims
        return (rows, cols), (cols, 1), 1
    outer, r, inner = lay.dims
    return (outer, inner, r), (r * inner, 1, inner), 2


class VariancePlan(Plan):
    """Two-pass variance (mean, then squared deviations) in the accumulator dtype; GPU SKU
    ``general``: a thread per output over a strided view of any axes (long reductions with
    few outputs use few threads: correct, not fast). Deterministic and bit-stable."""

    op = "variance"
    category = "reduction"
    spec = VARIANCE

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        _var_axes(desc)

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        return [Candidate("general", BackendKind.NVRTC, True, True, sn(d), sn(accumulator(d)))]

    def _prepare(self) -> None:
        d = self.desc
        shape = tuple(int(e) for e in d.shape)
        self._axes = _var_axes(d)
        self._acc = accumulator(d.dtype)
        n_out = math.prod(e for i, e in enumerate(shape) if i not in self._axes)
        n_red = math.prod(shape[a] for a in self._axes)
        self._kernel = f"variance_general<{cuda_name(d.dtype)}, {int(bool(d.std))}>"
        if n_out == 0 or n_red == 0:
            self._params = None  # nothing to read: the host path fills NaN (0 / 0)
            return
        ext, strides, nk = _general_dims(shape, self._axes)
        pad = _MAX_DIMS - len(ext)
        self._grid = _grid(n_out)
        self._params = (np.int64(n_out), np.int64(n_red), np.int32(nk), np.int32(len(ext) - nk),
                        *(np.int64(e) for e in ext + (1,) * pad),
                        *(np.int64(s) for s in strides + (0,) * pad),
                        self._acc.type(d.correction))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        acc, axes = self._acc, self._axes
        x = args.x.astype(acc, copy=False)
        n = math.prod(x.shape[a] for a in axes)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.sum(x, axis=axes, keepdims=True, dtype=acc) / acc.type(n)
            sq = np.sum((x - mean) ** 2, axis=axes, keepdims=self.desc.keepdims, dtype=acc)
            v = sq / acc.type(max(0.0, n - self.desc.correction))
            if self.desc.std:
                v = np.sqrt(v)
        args.y[...] = np.asarray(v).astype(self.desc.dtype)

    def _run_general(self, stream: Stream, ws: Workspace, args: Any) -> None:
        if self._params is None:
            args.y[...] = np.nan  # variance of nothing: 0 / 0, as torch
            return
        launch(stream, MODULE.function(self._kernel, stream.device_id), self._grid, 256,
               (args.x, args.y, *self._params))


# -- gradient of prod along one dim -------------------------------------------------------------

PROD_BACKWARD = OpSpec(
    "prod_backward",
    fields=(*_ROW, _DTYPE),
    operands=(_X, In("dy", ("outer", "inner")), Out("dx", ("outer", "length", "inner"))),
)
ProdBackwardDescriptor = PROD_BACKWARD.descriptor(
    "ProdBackwardDescriptor", "dx [outer, length, inner] of y = prod(x, dim) from dy "
    "[outer, inner]: dy times the product of the other elements (exact for zeros).")
ProdBackwardArgs = PROD_BACKWARD.args("ProdBackwardArgs", "x, dy, dx (written).")


class ProdBackwardPlan(Plan):
    """dx of a product: dy * p / x without zeros (p in the accumulator dtype), the product of
    the others at a row's only zero, 0 elsewhere. GPU SKU ``column``: a thread per (o, i)."""

    op = "prod_backward"
    category = "reduction"
    spec = PROD_BACKWARD

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        return [host_candidate(d)] if stream.is_host else [
            Candidate("column", BackendKind.NVRTC, True, True, sn(d), sn(accumulator(d)))]

    def _prepare(self) -> None:
        d = self.desc
        self._kernel = f"prod_backward<{cuda_name(d.dtype)}>"
        self._grid = _grid(d.outer * d.inner)
        self._extents = (np.int64(d.outer), np.int64(d.length), np.int64(d.inner))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        acc = accumulator(self.desc.dtype)
        x = args.x.astype(acc, copy=False)
        zero = x == 0
        zeros = zero.sum(axis=1, keepdims=True)
        p = np.prod(np.where(zero, acc.type(1), x), axis=1, keepdims=True, dtype=acc)
        g = args.dy.astype(acc)[:, None, :]
        with np.errstate(invalid="ignore", divide="ignore"):
            d = np.where(zeros == 0, g * (p / np.where(zero, acc.type(1), x)),
                         np.where((zeros == 1) & zero, g * p, acc.type(0)))
        args.dx[...] = d.astype(self.desc.dtype)

    def _run_column(self, stream: Stream, ws: Workspace, args: Any) -> None:
        launch(stream, MODULE.function(self._kernel, stream.device_id), self._grid, 256,
               (args.x, args.dy, args.dx, *self._extents))


# -- functional API ------------------------------------------------------------------------------


def dim_view(op: str, shape: tuple, dim: int | None) -> tuple[int, int, int]:
    """(outer, length, inner) of `shape` around `dim` (None: the whole tensor as one row)."""
    if dim is None:
        return 1, math.prod(shape), 1
    nd = len(shape)
    r = max(nd, 1)  # a 0-d tensor takes dim 0 and -1, like torch
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not -r <= dim < r:
        raise InvalidProblem(describe(op, "dim", f"an int in [-{r}, {r})", dim))
    if nd == 0:
        return 1, 1, 1
    d = int(dim) % nd
    return math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:])


def _kept(shape: tuple, dim: int | None, keepdim: bool) -> tuple:
    if dim is None or not shape:
        return (1,) * len(shape) if keepdim else ()
    d = int(dim) % len(shape)
    return shape[:d] + ((1,) if keepdim else ()) + shape[d + 1:]


def arg_select(op: str, x: Any, dim: int | None = None, keepdim: bool = False
               ) -> tuple[Any, Any]:
    """(values, int64 indices) of the max or min of x along `dim` (None: all elements, the
    index into the flattened tensor)."""
    o, n, i = dim_view("arg_select", x.shape, dim)
    vals, idx = call(ArgSelectPlan, ArgSelectDescriptor(op, o, n, i, x.dtype), like=x,
                     x=backend.ascontiguous(x).reshape(o, n, i))
    shape = _kept(tuple(x.shape), dim, keepdim)
    return vals.reshape(shape), idx.reshape(shape)


def topk(x: Any, k: int, dim: int = -1, largest: bool = True) -> tuple[Any, Any]:
    """(values, int64 indices): the k largest (smallest) entries along `dim`, in order."""
    o, n, i = dim_view("topk", x.shape, dim)
    vals, idx = call(TopkPlan, TopkDescriptor(o, n, i, k, bool(largest), x.dtype), like=x,
                     x=backend.ascontiguous(x).reshape(o, n, i))
    shape = list(x.shape) or [1]
    shape[int(dim) % len(shape)] = k
    return vals.reshape(tuple(shape[:x.ndim])), idx.reshape(tuple(shape[:x.ndim]))


def variance(x: Any, axes: Any = None, keepdims: bool = False, correction: float = 1.0,
             std: bool = False) -> Any:
    """Variance (std: standard deviation) over `axes` with `correction` (1: unbiased)."""
    if isinstance(axes, list):
        axes = tuple(axes)
    desc = VarianceDescriptor(x.shape, axes, keepdims, float(correction), bool(std), x.dtype)
    return call(VariancePlan, desc, like=x, x=backend.ascontiguous(x))


def prod_backward(x: Any, dy: Any, dim: int | None = None) -> Any:
    """dx (x's shape) of y = prod(x, dim) from dy (y's shape, kept dim or not)."""
    o, n, i = dim_view("prod_backward", x.shape, dim)
    try:  # free when right: a mis-shaped dy is named, not NumPy's reshape error
        dy = backend.ascontiguous(dy).reshape(o, i)
    except ValueError:
        raise InvalidProblem(describe("prod_backward", "dy", f"shape {_kept(x.shape, dim, False)}"
                                      " (dim kept or not)", f"shape {dy.shape}")) from None
    dx = call(ProdBackwardPlan, ProdBackwardDescriptor(o, n, i, x.dtype), like=x,
              x=backend.ascontiguous(x).reshape(o, n, i), dy=dy)
    return dx.reshape(x.shape)
