"""Reductions over axes (sum, mean, max) and the one-launch global L2 norm of many tensors.

reduce:          y = op(x, axes) with NumPy's axis/keepdims semantics; mean = sum / count.
global_l2_norm:  y = sqrt(sum_i sum_j x_i[j]^2) over a list of tensors (gradient clipping).

Both are deterministic and bit-stable on the GPU: the order in which values are combined is a
function of the problem's shape only (logical element index, constant block sizes, fixed
split lengths), never of the grid size, the device or the scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import (
    FLOAT_DTYPES,
    HALF_DTYPES,
    accumulator,
    as_dtype,
    cuda_name,
    float32,
    float64,
    short_name,
)
from gpuplan.errors import BufferTooSmall, InvalidProblem, Unsupported, describe
from gpuplan.execute import execute
from gpuplan.nvrtc import CudaModule, cdiv, launch, on_stream
from gpuplan.plan import (
    BackendKind,
    Candidate,
    Plan,
    check_dtype,
    check_operand,
    check_writable_distinct,
    host_candidate,
)
from gpuplan.stream import Stream, Workspace

__all__ = [
    "ReduceDescriptor",
    "ReduceArgs",
    "ReducePlan",
    "GlobalNormDescriptor",
    "GlobalNormArgs",
    "GlobalNormPlan",
]
__functional__ = ["reduce", "global_l2_norm"]

REDUCE_OPS = ("sum", "mean", "max")
_OP_CODE = {"sum": 0, "mean": 0, "max": 1}
#: (input, output) type pairs: same type, and half <-> f32 for partials and f32 temporaries.
_PAIRS = [(t, t) for t in FLOAT_DTYPES] + [p for h in HALF_DTYPES for p in ((h, float32),
                                                                           (float32, h))]
_MAX_DIMS = 8
_MAX_GRID = 1 << 18
_SPLIT_ROWS_LEN = 16384     # segment length when few rows are very long
_SPLIT_COLS_LEN = 256       # reduced rows per split when few columns are very tall
_NORM_CHUNK = 16384         # must match kNormChunk in reduction.cu
_NORM_CODES = {float32: 0, float64: 1, as_dtype(np.float16): 2, as_dtype("bfloat16"): 3}

_MODULE = CudaModule(
    __file__,
    "reduction.cu",
    [f"reduce_rows<{cuda_name(a)}, {cuda_name(b)}, {op}, {tpr}>" for a, b in _PAIRS
     for op in (0, 1) for tpr in (32, 256)]
    + [f"reduce_{k}<{cuda_name(a)}, {cuda_name(b)}, {op}>" for k in ("cols", "general")
       for a, b in _PAIRS for op in (0, 1)]
    + ["global_l2_norm<float>", "global_l2_norm<double>"],
)


def _align(n: int, a: int = 256) -> int:
    return -(-n // a) * a


def _prod(xs: Any) -> int:
    return int(np.prod(np.asarray(xs, dtype=np.int64), dtype=np.int64)) if len(xs) else 1


# -- layout: which kernel reduces a problem, with which parameters ----------------------


@dataclass(frozen=True)
class ReduceLayout:
    """How a (shape, reduced axes) problem runs on the GPU.

    kind 'rows' (x as [rows, cols], reduce cols), 'cols' (x as [outer, R, inner], reduce R)
    or 'general' (strided view: kept dims then reduced dims). `split` > 1 means a first pass
    writes `split` partials per output into the workspace and a second pass reduces them.
    """

    kind: str
    n_out: int
    n_red: int
    dims: tuple  # rows: (rows, cols); cols: (outer, R, inner); general: (shape, strides, nk)
    split: int = 1
    split_len: int = 0

    def workspace_bytes(self, acc_itemsize: int) -> int:
        return _align(self.n_out * self.split * acc_itemsize) if self.split > 1 else 0


def reduce_layout(shape: tuple, axes: frozenset) -> ReduceLayout:
    """Collapse size-1 dims and merge neighbours of the same kind, then pick a kernel."""
    n_out = _prod([e for i, e in enumerate(shape) if i not in axes])
    n_red = _prod([e for i, e in enumerate(shape) if i in axes])
    if n_out == 0 or n_red == 0:
        return ReduceLayout("rows", n_out, n_red, (n_out, 0))
    dims: list[list] = []
    for i, e in enumerate(shape):
        if e == 1:
            continue
        red = i in axes
        if dims and dims[-1][1] == red:
            dims[-1][0] *= e
        else:
            dims.append([e, red])
    pattern = tuple(r for _, r in dims)
    ext = [e for e, _ in dims]
    if pattern in ((), (False,)):
        return _cols_layout(n_out, n_red, 1, 1, max(1, n_out))
    if pattern == (True,):
        return _rows_layout(n_out, n_red, 1, ext[0])
    if pattern == (False, True):
        return _rows_layout(n_out, n_red, ext[0], ext[1])
    if pattern == (True, False):
        return _cols_layout(n_out, n_red, 1, ext[0], ext[1])
    if pattern == (False, True, False):
        return _cols_layout(n_out, n_red, ext[0], ext[1], ext[2])
    if len(dims) > _MAX_DIMS:
        raise Unsupported(describe("reduce", "shape", f"at most {_MAX_DIMS} dims after merging",
                                   f"{len(dims)} alternating kept/reduced groups"))
    strides = [_prod(ext[i + 1:]) for i in range(len(ext))]
    kept = [i for i, (_, r) in enumerate(dims) if not r]
    red = [i for i, (_, r) in enumerate(dims) if r]
    order = kept + red
    return ReduceLayout("general", n_out, n_red,
                        (tuple(ext[i] for i in order), tuple(strides[i] for i in order),
                         len(kept)))


def _rows_layout(n_out: int, n_red: int, rows: int, cols: int) -> ReduceLayout:
    if cols <= 8:  # too short to share a warp: one thread per row
        return _cols_layout(n_out, n_red, rows, cols, 1)
    if rows < 1024 and cols > 4 * _SPLIT_ROWS_LEN:
        return ReduceLayout("rows", n_out, n_red, (rows, cols), cdiv(cols, _SPLIT_ROWS_LEN),
                            _SPLIT_ROWS_LEN)
    return ReduceLayout("rows", n_out, n_red, (rows, cols))


def _cols_layout(n_out: int, n_red: int, outer: int, r: int, inner: int) -> ReduceLayout:
    if n_out < 65536 and r > 4 * _SPLIT_COLS_LEN:
        return ReduceLayout("cols", n_out, n_red, (outer, r, inner), cdiv(r, _SPLIT_COLS_LEN),
                            _SPLIT_COLS_LEN)
    return ReduceLayout("cols", n_out, n_red, (outer, r, inner))


def _tpr(cols: int) -> int:
    return 32 if cols <= 1024 else 256


def launch_reduce(stream: Stream, layout: ReduceLayout, op_code: int, x: Any, y: Any,
                  divisor: float, ws: Workspace, ws_offset: int = 0) -> None:
    """Reduce device array `x` into `y` (contiguous, n_out elements) following `layout`.

    `divisor` divides sums (1: sum, count: mean, -1: negated sum). Partials of a split
    layout use `layout.workspace_bytes(...)` bytes of `ws` from `ws_offset`.
    """
    tin, tout = as_dtype(x.dtype), as_dtype(y.dtype)
    acc = accumulator(tout)
    div = acc.type(divisor)
    dev = stream.device_id
    if layout.split > 1:
        part = ws.view(acc, layout.n_out * layout.split, ws_offset)
        _launch_one(stream, layout, op_code, x, part, tin, acc, acc.type(1), dev)
        _launch_second(stream, layout, op_code, part, y, acc, tout, div, dev)
    else:
        _launch_one(stream, layout, op_code, x, y, tin, tout, div, dev)


def _launch_one(stream, layout, op_code, x, y, tin, tout, div, dev) -> None:
    names = f"{cuda_name(tin)}, {cuda_name(tout)}, {op_code}"
    i64 = np.int64
    if layout.kind == "rows":
        rows, cols = layout.dims
        s, seg = (layout.split, layout.split_len) if layout.split > 1 else (1, max(cols, 1))
        tpr = 256 if layout.split > 1 else _tpr(cols)
        fn = _MODULE.function(f"reduce_rows<{names}, {tpr}>", dev)
        grid = min(cdiv(rows * s, 256 // tpr), _MAX_GRID)
        launch(stream, fn, grid, 256, (x, y, i64(rows), i64(cols), i64(s), i64(seg), div))
    elif layout.kind == "cols":
        outer, r, inner = layout.dims
        s, seg = (layout.split, layout.split_len) if layout.split > 1 else (1, r)
        fn = _MODULE.function(f"reduce_cols<{names}>", dev)
        grid = min(cdiv(outer * s * inner, 256), _MAX_GRID)
        launch(stream, fn, grid, 256,
               (x, y, i64(outer), i64(r), i64(inner), i64(s), i64(seg), div))
    else:
        shape, strides, nk = layout.dims
        pad = _MAX_DIMS - len(shape)
        fn = _MODULE.function(f"reduce_general<{names}>", dev)
        grid = min(cdiv(layout.n_out, 256), _MAX_GRID)
        launch(stream, fn, grid, 256,
               (x, y, i64(layout.n_out), i64(layout.n_red), np.int32(nk),
                np.int32(len(shape) - nk), *(i64(e) for e in shape + (1,) * pad),
                *(i64(e) for e in strides + (0,) * pad), div))


def _launch_second(stream, layout, op_code, part, y, acc, tout, div, dev) -> None:
    """Reduce the [.., split, ..] partials of a split layout in ascending split order."""
    s = layout.split
    if layout.kind == "rows":
        rows, _ = layout.dims
        second = ReduceLayout("rows", layout.n_out, s, (rows, s))
    else:
        outer, _, inner = layout.dims
        second = ReduceLayout("cols", layout.n_out, s, (outer, s, inner))
    _launch_one(stream, second, op_code, part, y, acc, tout, div, dev)


def normalize_axes(op: str, shape: tuple, axes: Any) -> tuple[int, ...]:
    """Sorted non-negative axes; InvalidProblem for out-of-range or repeated axes."""
    nd = len(shape)
    if axes is None:
        return tuple(range(nd))
    raw = (axes,) if isinstance(axes, (int, np.integer)) else tuple(axes)
    out = []
    for a in raw:
        if not isinstance(a, (int, np.integer)) or not -nd <= int(a) < nd:
            raise InvalidProblem(describe(op, "axes", f"ints in [-{nd}, {nd})", axes))
        out.append(int(a) % nd)
    if len(set(out)) != len(out):
        raise InvalidProblem(describe(op, "axes", "distinct axes", axes))
    return tuple(sorted(out))


# -- reduce ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReduceDescriptor:
    """y = op(x[shape], axes) for op in sum/mean/max; axes: int, tuple or None (all)."""

    op: str
    shape: tuple
    axes: Any = None
    keepdims: bool = False
    dtype: Any = np.float32

    def reduced_axes(self) -> tuple[int, ...]:
        return normalize_axes("reduce", tuple(self.shape), self.axes)

    def out_shape(self) -> tuple[int, ...]:
        axes = self.reduced_axes()
        if self.keepdims:
            return tuple(1 if i in axes else int(e) for i, e in enumerate(self.shape))
        return tuple(int(e) for i, e in enumerate(self.shape) if i not in axes)


@dataclass(frozen=True)
class ReduceArgs:
    x: Any  # [shape], C-contiguous
    y: Any  # [out_shape]


class ReducePlan(Plan):
    """Sum / mean / max over axes, accumulating in f32 for halves (f64 for f64).

    GPU SKUs by layout: ``rows`` (reduced axes last: a warp, or a block for rows longer than
    1024, per row; very long rows are split into fixed segments), ``cols`` (reduced axes
    between kept ones, inner axes contiguous: a thread per output walks the reduced rows in
    order; tall problems split into fixed row blocks) and ``general`` (any other pattern,
    a thread per output over a strided view). All deterministic and bit-stable.
    """

    op = "reduce"
    category = "reduction"

    @classmethod
    def _check_descriptor(cls, desc: ReduceDescriptor) -> None:
        if desc.op not in REDUCE_OPS:
            raise Unsupported(describe(cls.op, "op", f"one of {REDUCE_OPS}", repr(desc.op)))
        shape = tuple(desc.shape)
        if any(int(e) < 0 for e in shape):
            raise InvalidProblem(describe(cls.op, "shape", "extents >= 0", shape))
        axes = desc.reduced_axes()
        if desc.op == "max" and _prod([shape[a] for a in axes]) == 0 and _prod(
                desc.out_shape()) > 0:
            raise InvalidProblem(describe(cls.op, "shape", "non-empty reduced axes for max",
                                          shape))

    @classmethod
    def _candidates(cls, desc: ReduceDescriptor, on_device: bool) -> list[Candidate]:
        d = check_dtype(cls.op, "dtype", desc.dtype, FLOAT_DTYPES)
        if not on_device:
            return [host_candidate(d)]
        lay = reduce_layout(tuple(int(e) for e in desc.shape), frozenset(desc.reduced_axes()))
        acc = accumulator(d)
        return [Candidate(lay.kind, BackendKind.NVRTC, True, True, short_name(d),
                          short_name(acc), lay.workspace_bytes(acc.itemsize))]

    def _check_args(self, args: ReduceArgs) -> None:
        d = self.desc
        check_operand(self.op, "x", args.x, tuple(d.shape), d.dtype)
        check_operand(self.op, "y", args.y, d.out_shape(), d.dtype)
        check_writable_distinct(self.op, {"y": args.y}, {"x": args.x})

    def _is_empty(self) -> bool:
        return _prod(self.desc.out_shape()) == 0

    def _divisor(self) -> float:
        d = self.desc
        return float(_prod([d.shape[a] for a in d.reduced_axes()])) if d.op == "mean" else 1.0

    def _run_numpy(self, stream: Stream, ws: Workspace, args: ReduceArgs) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        xa = args.x.astype(acc, copy=False)
        axes = d.reduced_axes()
        if d.op == "max":
            r = np.max(xa, axis=axes, keepdims=d.keepdims)
        else:
            r = np.sum(xa, axis=axes, keepdims=d.keepdims, dtype=acc)
            if d.op == "mean":
                with np.errstate(invalid="ignore", divide="ignore"):
                    r = r / acc.type(self._divisor())
        args.y[...] = np.asarray(r).astype(d.dtype)

    def _run_device(self, stream: Stream, ws: Workspace, args: ReduceArgs) -> None:
        d = self.desc
        lay = reduce_layout(tuple(int(e) for e in d.shape), frozenset(d.reduced_axes()))
        launch_reduce(stream, lay, _OP_CODE[d.op], args.x, args.y, self._divisor(), ws)

    _run_rows = _run_cols = _run_general = _run_device


# -- global L2 norm ------------------------------------------------------------------------


@dataclass(frozen=True)
class GlobalNormDescriptor:
    """sqrt of the sum of squares of every element of len(sizes) tensors of the given dtypes."""

    sizes: tuple
    dtypes: tuple

    def out_dtype(self) -> np.dtype:
        return float64 if any(as_dtype(t) == float64 for t in self.dtypes) else float32


@dataclass(frozen=True)
class GlobalNormArgs:
    arrays: tuple  # len(sizes) C-contiguous arrays, arrays[i].size == sizes[i]
    out: Any       # 0-d (or one-element) array of desc.out_dtype()


class GlobalNormPlan(Plan):
    """One launch over all tensors: per-chunk partial sums of squares in the workspace, then
    the last block to finish sums them in chunk order (deterministic, bit-stable)."""

    op = "global_l2_norm"
    category = "reduction"

    @classmethod
    def _check_descriptor(cls, desc: GlobalNormDescriptor) -> None:
        if len(desc.sizes) != len(desc.dtypes):
            raise InvalidProblem(describe(cls.op, "dtypes", f"{len(desc.sizes)} dtypes "
                                          "(one per size)", len(desc.dtypes)))
        for i, s in enumerate(desc.sizes):
            if int(s) < 0:
                raise InvalidProblem(describe(cls.op, f"sizes[{i}]", "an extent >= 0", s))

    @classmethod
    def _candidates(cls, desc: GlobalNormDescriptor, on_device: bool) -> list[Candidate]:
        for i, t in enumerate(desc.dtypes):
            check_dtype(cls.op, f"dtypes[{i}]", t, FLOAT_DTYPES)
        out = desc.out_dtype()
        if not on_device:
            return [Candidate("numpy", BackendKind.NUMPY, True, True, "mixed", short_name(out))]
        return [Candidate("chunked", BackendKind.NVRTC, True, True, "mixed", short_name(out),
                          cls._table_bytes(desc)
                          + _align(max(cls._n_chunks(desc), 1) * out.itemsize))]

    @staticmethod
    def _n_chunks(desc: GlobalNormDescriptor) -> int:
        return sum(cdiv(int(s), _NORM_CHUNK) for s in desc.sizes)

    @staticmethod
    def _table_bytes(desc: GlobalNormDescriptor) -> int:
        return _align((4 * len(desc.sizes) + 2) * 8)

    def _sku_dtype(self) -> Any:
        return self.desc.out_dtype()

    def _check_args(self, args: GlobalNormArgs) -> None:
        d = self.desc
        arrays = tuple(args.arrays)
        if len(arrays) != len(d.sizes):
            raise InvalidProblem(describe(self.op, "arrays", f"{len(d.sizes)} arrays",
                                          len(arrays)))
        on_device = not self._stream.is_host
        for i, (a, s, t) in enumerate(zip(arrays, d.sizes, d.dtypes, strict=True)):
            name = f"arrays[{i}]"
            if not hasattr(a, "shape") or backend.is_device_array(a) != on_device:
                where = "device (CuPy)" if on_device else "host (NumPy)"
                raise InvalidProblem(describe(self.op, name, f"a {where} array",
                                              type(a).__name__))
            if on_device and a.device.id != self._stream.device_id:
                raise InvalidProblem(describe(self.op, name, f"an array on device "
                                              f"{self._stream.device_id}", a.device.id))
            check_dtype(self.op, name, a.dtype, (t,))
            if a.size < int(s):
                raise BufferTooSmall(describe(self.op, name, f"at least {s} elements", a.size))
            if a.size != int(s):
                raise InvalidProblem(describe(self.op, name, f"{s} elements", a.size))
            check_operand(self.op, name, a, tuple(a.shape), t)
        if getattr(args.out, "size", None) != 1:
            raise InvalidProblem(describe(self.op, "out", "a one-element array",
                                          getattr(args.out, "shape", type(args.out).__name__)))
        check_operand(self.op, "out", args.out, tuple(args.out.shape), d.out_dtype())

    def _run_numpy(self, stream: Stream, ws: Workspace, args: GlobalNormArgs) -> None:
        acc = self.desc.out_dtype()
        total = acc.type(0)
        for a in args.arrays:
            v = np.ravel(a).astype(acc, copy=False)
            total = total + np.dot(v, v)
        args.out[...] = np.sqrt(total)

    def _run_chunked(self, stream: Stream, ws: Workspace, args: GlobalNormArgs) -> None:
        d = self.desc
        n = len(d.sizes)
        table = np.zeros(4 * n + 2, dtype=np.int64)  # last slot: the zeroed ticket counter
        table[:n] = [a.data.ptr for a in args.arrays]
        table[n:2 * n] = [int(s) for s in d.sizes]
        table[2 * n:3 * n] = [_NORM_CODES[as_dtype(t)] for t in d.dtypes]
        table[3 * n + 1:4 * n + 1] = np.cumsum([cdiv(int(s), _NORM_CHUNK) for s in d.sizes],
                                               dtype=np.int64)
        dev_table = ws.view(np.int64, table.size, 0)
        with on_stream(stream):
            dev_table.set(table)
        acc = d.out_dtype()
        n_chunks = self._n_chunks(d)
        partials = ws.view(acc, max(n_chunks, 1), self._table_bytes(d))
        fn = _MODULE.function(f"global_l2_norm<{cuda_name(acc)}>", stream.device_id)
        launch(stream, fn, max(1, min(n_chunks, 1024)), 256,
               (dev_table, np.int32(n), partials, args.out), reachable=args.arrays)


# -- functional API ------------------------------------------------------------------------


def reduce(name: str, x: Any, axes: Any = None, keepdims: bool = False) -> Any:
    """y = sum/mean/max of x over `axes` (int, tuple or None: all); y.dtype == x.dtype."""
    if isinstance(axes, list):
        axes = tuple(axes)
    desc = ReduceDescriptor(name, tuple(int(e) for e in x.shape), axes, keepdims, x.dtype)
    x = backend.ascontiguous(x)
    y = backend.array_namespace(x).empty(desc.out_shape(), dtype=x.dtype)
    execute(ReducePlan, desc, ReduceArgs(x, y), like=x)
    return y


def global_l2_norm(arrays: list) -> Any:
    """0-d sqrt(sum of squares of all elements of all arrays): f32, or f64 if any input is."""
    arrays = tuple(backend.ascontiguous(a) for a in arrays)
    if not arrays:
        return np.zeros((), dtype=np.float32)
    desc = GlobalNormDescriptor(tuple(int(a.size) for a in arrays),
                                tuple(as_dtype(a.dtype) for a in arrays))
    out = backend.array_namespace(arrays[0]).empty((), dtype=desc.out_dtype())
    execute(GlobalNormPlan, desc, GlobalNormArgs(arrays, out), like=arrays[0])
    return out
