"""Indexing along one dim: gather / index_select and scatter_add / index_add (their gradients).

x and out are viewed as [outer, L, inner] around the dim, index and src as [outer, n, inner]
(`shared_index`: one index vector [n] for every (o, i), index_select's and index_add's).

    gather:      out[o, j, i] = x[o, index[o, j, i], i]
    scatter_add: out[o, index[o, j, i], i] += src[o, j, i]   (out read and written in place)

Indices must lie in [0, L): the functional API checks them (one min/max) and raises before
any launch; the kernels themselves never read or write outside the arrays (gather writes 0,
scatter_add skips such entries). scatter_add is deterministic without atomics: the entries
are sorted by (index, j) (unique int64 keys, so any sort gives the same order), then a thread
per output element sums its run in ascending j in the accumulator dtype and adds it once,
exactly as the NumPy implementation does (bit-identical to it for f32/f64).
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
from gpuplan.nvrtc import CudaModule, cdiv, launch, on_stream
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import INDEX, DType, Extent, Flag, In, InOut, OpSpec, Out
from gpuplan.stream import Stream, Workspace

__all__ = ["GatherDescriptor", "GatherArgs", "GatherPlan",
           "ScatterAddDescriptor", "ScatterAddArgs", "ScatterAddPlan"]
__functional__ = ["gather", "scatter_add", "index_select", "index_add"]

_INDEX_CTYPES = {"i32": "int", "i64": "long long"}
_MAX_GRID = 1 << 18
MODULE = CudaModule(
    __file__, "gather.cu",
    [f"gather_dim<{cuda_name(t)}, {i}, {s}>" for t in FLOAT_DTYPES
     for i in _INDEX_CTYPES.values() for s in (0, 1)]
    + [f"scatter_add_sorted<{cuda_name(t)}>" for t in FLOAT_DTYPES],
)

_FIELDS = (Extent("outer"), Extent("length"), Extent("inner"), Extent("n"),
           Flag("shared_index", default=False), DType("dtype", FLOAT_DTYPES, default=np.float32))


def _index_shape(d: Any) -> tuple[int, ...]:
    return (d.n,) if d.shared_index else (d.outer, d.n, d.inner)


_ROWS = ("outer", "n", "inner")
_TABLE = ("outer", "length", "inner")

GATHER = OpSpec("gather", fields=_FIELDS,
                operands=(In("x", _TABLE), In("index", _index_shape, INDEX), Out("out", _ROWS)))
SCATTER_ADD = OpSpec(
    "scatter_add", fields=_FIELDS,
    operands=(In("index", _index_shape, INDEX), In("src", _ROWS),
              InOut("out", _TABLE, distinct=("index", "src"))),
    empty=("outer", "inner", "length", "n"))
GatherDescriptor = GATHER.descriptor(
    "GatherDescriptor", "out [outer, n, inner] = x [outer, length, inner] gathered along the "
    "middle dim by index [outer, n, inner] (shared_index: [n], index_select).")
GatherArgs = GATHER.args("GatherArgs", "x, index (int32 or int64), out (written).")
ScatterAddDescriptor = SCATTER_ADD.descriptor(
    "ScatterAddDescriptor", "out [outer, length, inner] += src [outer, n, inner] scattered "
    "along the middle dim by index [outer, n, inner] (shared_index: [n], index_add).")
ScatterAddArgs = SCATTER_ADD.args("ScatterAddArgs", "index (int32 or int64), src, out "
                                  "(accumulated into in place).")


def _grid(n: int) -> int:
    return max(1, min(cdiv(n, 256), _MAX_GRID))


class GatherPlan(Plan):
    """Gather along a dim; GPU SKU ``gather``: a thread per output element. Exact."""

    op = "gather"
    category = "gather"
    spec = GATHER

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        return [Candidate("gather", BackendKind.NVRTC, True, True, sn(d), sn(d))]

    def _prepare(self) -> None:
        d = self.desc
        self._kernels = {k: f"gather_dim<{cuda_name(d.dtype)}, {c}, {int(d.shared_index)}>"
                         for k, c in _INDEX_CTYPES.items()}
        self._grid = _grid(d.outer * d.n * d.inner)
        self._extents = (np.int64(d.outer), np.int64(d.length), np.int64(d.inner),
                         np.int64(d.n))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        idx = args.index.astype(np.int64)
        idx = idx[None, :, None] if d.shared_index else idx
        idx = np.broadcast_to(idx, (d.outer, d.n, d.inner))
        valid = (idx >= 0) & (idx < d.length)
        safe = np.where(valid, idx, 0)
        if d.length == 0:
            args.out[...] = 0
            return
        args.out[...] = np.where(valid, np.take_along_axis(args.x, safe, axis=1),
                                 args.x.dtype.type(0))

    def _run_gather(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = MODULE.function(self._kernels[self._index_dtype], stream.device_id)
        launch(stream, fn, self._grid, 256, (args.x, args.index, args.out, *self._extents))


class ScatterAddPlan(Plan):
    """Scatter-add along a dim, deterministic and bit-stable (see the module docstring).
    GPU SKU ``sorted``: one sort of int64 keys (CuPy), then a thread per output element."""

    op = "scatter_add"
    category = "scatter"
    spec = SCATTER_ADD

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        return [Candidate("sorted", BackendKind.NVRTC, True, True, sn(d), sn(accumulator(d)))]

    def _prepare(self) -> None:
        d = self.desc
        self._kernel = f"scatter_add_sorted<{cuda_name(d.dtype)}>"
        self._grid = _grid(d.outer * d.length * d.inner)
        self._extents = (np.int64(d.outer), np.int64(d.length), np.int64(d.inner),
                         np.int64(d.n), np.int32(d.shared_index))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        idx = args.index.astype(np.int64)
        idx = np.broadcast_to(idx[None, :, None] if d.shared_index else idx,
                              (d.outer, d.n, d.inner))
        valid = (idx >= 0) & (idx < d.length)
        o, _, i = np.nonzero(valid)
        r = idx[valid]
        sums = np.zeros((d.outer, d.length, d.inner), acc)
        hits = np.zeros((d.outer, d.length, d.inner), bool)
        # np.add.at adds in C order of the entries: ascending j per output, as the kernel.
        np.add.at(sums, (o, r, i), args.src[valid].astype(acc))
        hits[o, r, i] = True
        out = args.out
        out[hits] = (out[hits].astype(acc) + sums[hits]).astype(d.dtype)

    def _run_sorted(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        xp = backend.array_namespace(args.index)
        with on_stream(stream):
            idx = xp.clip(args.index.astype(np.int64), -1, d.length)
            j = xp.arange(d.n, dtype=np.int64)
            keys = idx * d.n + (j if d.shared_index else j[None, :, None])
            # Keys are unique per column: any sort (stable or not) gives one order.
            keys = xp.ascontiguousarray(xp.sort(keys, axis=0 if d.shared_index else 1))
        launch(stream, MODULE.function(self._kernel, stream.device_id), self._grid, 256,
               (args.out, args.src, keys, *self._extents))


# -- functional API --------------------------------------------------------------------------


def _dim(op: str, ndim: int, dim: Any) -> int:
    if ndim == 0:
        raise InvalidProblem(describe(op, "x", "an array of rank >= 1", "rank 0"))
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or \
            not -ndim <= dim < ndim:
        raise InvalidProblem(describe(op, "dim", f"an int in [-{ndim}, {ndim})", dim))
    return int(dim) % ndim


def check_indices(op: str, index: Any, length: int) -> None:
    """InvalidProblem unless every index lies in [0, length) (one min and max; on a GPU,
    a synchronization: the price of torch's bounds errors)."""
    if index.size == 0:
        return
    xp = backend.array_namespace(index)
    lo, hi = int(xp.min(index)), int(xp.max(index))
    if lo < 0 or hi >= length:
        bad = lo if lo < 0 else hi
        raise InvalidProblem(describe(op, "index", f"values in [0, {length})", bad))


def _view(shape: tuple, d: int) -> tuple[int, int, int]:
    return math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:])


def _index_array(op: str, index: Any) -> Any:
    if index.dtype.kind not in "iu":
        raise InvalidProblem(describe(op, "index", "an integer array", index.dtype))
    if index.dtype not in (np.int32, np.int64):
        index = index.astype(np.int64)
    return backend.ascontiguous(index)


def _fit(op: str, name: str, a: Any, shape: tuple, d: int | None, base: tuple) -> Any:
    """`a` cut to `shape` (its leading corner), torch's rule: shape[k] <= base[k] for every
    k (but d). Returns a contiguous array."""
    if len(base) != len(shape):
        raise InvalidProblem(describe(op, name, f"a {len(shape)}-d array like 'index'",
                                      f"{len(base)}-d"))
    for k, (e, b) in enumerate(zip(shape, base, strict=True)):
        if k != d and e > b:
            raise InvalidProblem(describe(op, "index", f"size <= {b} in dim {k} (the size of "
                                          f"{name!r})", e))
    if any(e != b for k, (e, b) in enumerate(zip(shape, base, strict=True)) if k != d):
        sl = tuple(slice(None) if k == d else slice(0, e) for k, e in enumerate(shape))
        a = a[sl]
    return backend.ascontiguous(a)


def gather(x: Any, dim: int, index: Any) -> Any:
    """out[..., j, ...] = x[..., index[..., j, ...], ...] along `dim` (torch.gather):
    out.shape == index.shape; index.shape[k] <= x.shape[k] for k != dim."""
    d = _dim("gather", x.ndim, dim)
    index = _index_array("gather", index)
    check_indices("gather", index, x.shape[d])
    xs = _fit("gather", "x", x, index.shape, d, tuple(x.shape))
    o, n_len, i = _view(tuple(xs.shape), d)
    n = index.shape[d]
    out = call(GatherPlan, GatherDescriptor(o, n_len, i, n, False, x.dtype), like=x,
               x=xs.reshape(o, n_len, i), index=index.reshape(o, n, i))
    return out.reshape(index.shape)


def index_select(x: Any, dim: int, index: Any) -> Any:
    """x's entries at `index` (1-D) along `dim` (torch.index_select)."""
    d = _dim("index_select", x.ndim, dim)
    index = _index_array("index_select", index)
    if index.ndim != 1:
        raise InvalidProblem(describe("index_select", "index", "a 1-d array",
                                      f"shape {tuple(index.shape)}"))
    check_indices("index_select", index, x.shape[d])
    o, n_len, i = _view(tuple(x.shape), d)
    out = call(GatherPlan, GatherDescriptor(o, n_len, i, index.shape[0], True, x.dtype),
               like=x, x=backend.ascontiguous(x).reshape(o, n_len, i), index=index)
    return out.reshape(x.shape[:d] + (index.shape[0],) + x.shape[d + 1:])


def scatter_add(x: Any, dim: int, index: Any, src: Any) -> Any:
    """A copy of x with src[..., j, ...] added at x[..., index[..., j, ...], ...] along `dim`
    (torch.Tensor.scatter_add, out of place); index.shape[k] <= src.shape[k] for every k and
    <= x.shape[k] for k != dim. Deterministic (see the module docstring)."""
    d = _dim("scatter_add", x.ndim, dim)
    index = _index_array("scatter_add", index)
    check_indices("scatter_add", index, x.shape[d])
    if src.dtype != x.dtype:
        raise InvalidProblem(describe("scatter_add", "src", f"dtype {x.dtype} like 'x'",
                                      src.dtype))
    srcs = _fit("scatter_add", "src", src, index.shape, None, tuple(src.shape))
    region = tuple(slice(None) if k == d else slice(0, e) for k, e in enumerate(index.shape))
    out = backend.ascontiguous(x).copy()
    whole = all(k == d or e == out.shape[k] for k, e in enumerate(index.shape))
    if not whole:
        _fit("scatter_add", "x", x, index.shape, d, tuple(x.shape))  # the shape checks
    target = out if whole else backend.ascontiguous(out[region])
    o, n_len, i = _view(tuple(target.shape), d)
    n = index.shape[d]
    call(ScatterAddPlan, ScatterAddDescriptor(o, n_len, i, n, False, x.dtype), like=x,
         index=index.reshape(o, n, i), src=srcs.reshape(o, n, i),
         out=target.reshape(o, n_len, i))
    if not whole:
        out[region] = target
    return out


def index_add(x: Any, dim: int, index: Any, src: Any) -> Any:
    """A copy of x with src's slices along `dim` added at x's slices `index` (1-D)
    (torch.Tensor.index_add, out of place); src.shape == x.shape but len(index) at dim."""
    d = _dim("index_add", x.ndim, dim)
    index = _index_array("index_add", index)
    if index.ndim != 1:
        raise InvalidProblem(describe("index_add", "index", "a 1-d array",
                                      f"shape {tuple(index.shape)}"))
    check_indices("index_add", index, x.shape[d])
    want = x.shape[:d] + (index.shape[0],) + x.shape[d + 1:]
    if tuple(src.shape) != want or src.dtype != x.dtype:
        raise InvalidProblem(describe("index_add", "src", f"shape {want}, dtype {x.dtype}",
                                      f"shape {tuple(src.shape)}, dtype {src.dtype}"))
    out = backend.ascontiguous(x).copy()
    o, n_len, i = _view(tuple(x.shape), d)
    call(ScatterAddPlan, ScatterAddDescriptor(o, n_len, i, index.shape[0], True, x.dtype),
         like=x, index=index, src=backend.ascontiguous(src).reshape(o, index.shape[0], i),
         out=out.reshape(o, n_len, i))
    return out
