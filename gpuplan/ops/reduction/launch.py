"""Reduction kernels (reduction.cu): the table of reductions, which kernel reduces a
(shape, reduced axes) problem, and its launches. Shared by `gpuplan.ops.reduction.plans`
(ReducePlan, GlobalNormPlan) and the broadcast gradients of the binary family
(`reduce_layout`, `launch_reduce`).

Every reduction is one row of `REDUCTIONS`. The kernels know only how values combine
(`Combine`: sum, max, min or prod, the CUDA enumerators generated from this table through
-DGPUPLAN_ENUM_Combine); mean is a sum divided by the count. The global-norm kernel reads
tensors of the dtypes in `NORM_DTYPES` (enum NormType, one load branch each).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan import host_jit, host_pool
from gpuplan.dtypes import (
    FLOAT_DTYPES,
    HALF_DTYPES,
    accumulator,
    as_dtype,
    bfloat16,
    cuda_name,
    float16,
    float32,
    float64,
    short_name,
)
from gpuplan.errors import InvalidProblem, Unsupported, describe
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.stream import Stream, Workspace


def _host_sum(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    return np.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _host_max(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    return np.max(x, axis=axes, keepdims=keepdims)


def _host_min(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    return np.min(x, axis=axes, keepdims=keepdims)


def _host_prod(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    return np.prod(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


#: Columns a thread's part of the host column sums is aligned to (a 64-byte line of f32),
#: and the elements it needs: the kernel adds ~16 per ns, and on the 2-core VM a split's
#: hand-off (~30 us) cost more than the half it saved up to [1024, 512] (41 us on one
#: thread, 65 on two).
_COLUMN_ALIGN, _COLUMN_GRAIN = 16, 1 << 20


def host_column_sums(x: np.ndarray) -> np.ndarray | None:
    """x [rows, n] (f32, C-contiguous) summed over its rows (float32) by the compiled kernel,
    the threads taking blocks of columns: NumPy's row-by-row order whatever the split, so
    the NumPy path's bits; None without the kernels."""
    k = host_jit.extra("host_kernels_sums")
    if k is None:
        return None
    rows, n = x.shape
    acc = np.zeros(n, np.float32)
    host_pool.parallel_for(n, lambda lo, hi: k.column_sums(x, acc, lo, hi),
                           max(1, _COLUMN_GRAIN // max(1, rows)), _COLUMN_ALIGN)
    return acc


@dataclass(frozen=True)
class Reduction:
    """One reduction: its name, how the kernels combine values (a `COMBINES` entry), whether
    the combined value is divided by the count, and the NumPy combine (x, axes, keepdims)
    on arrays in the accumulator dtype. `has_identity`: an empty reduction has a value
    (sum 0, mean NaN, prod 1); max or min of nothing is an error."""

    name: str
    combine: str
    host: Callable[[np.ndarray, tuple, bool], np.ndarray]
    mean: bool = False
    has_identity: bool = True


REDUCTIONS: tuple[Reduction, ...] = (
    Reduction("sum", "sum", _host_sum),
    Reduction("mean", "sum", _host_sum, mean=True),
    Reduction("max", "max", _host_max, has_identity=False),  # NaN-propagating, like NumPy
    Reduction("min", "min", _host_min, has_identity=False),  # NaN-propagating, like NumPy
    Reduction("prod", "prod", _host_prod),  # an empty product is 1
)
REDUCE_OPS: tuple[str, ...] = tuple(r.name for r in REDUCTIONS)
BY_NAME = {r.name: r for r in REDUCTIONS}
#: enum Combine of reduction.cu: the index is the kernels' OP template argument.
COMBINES: tuple[str, ...] = tuple(dict.fromkeys(r.combine for r in REDUCTIONS))
SUM = COMBINES.index("sum")
#: enum NormType of reduction.cu: element types the global-norm kernel loads.
NORM_DTYPES = (float32, float64, float16, bfloat16)
NORM_CODES = {d: i for i, d in enumerate(NORM_DTYPES)}
NORM_CHUNK = 16384  # elements per global-norm block (passed to reduction.cu)

#: (input, output) type pairs: same type, and half <-> f32 for partials and f32 temporaries.
_PAIRS = [(t, t) for t in FLOAT_DTYPES] + [p for h in HALF_DTYPES for p in ((h, float32),
                                                                           (float32, h))]
_MAX_DIMS = 8
_MAX_GRID = 1 << 18
_SPLIT_ROWS_LEN = 16384     # segment length when few rows are very long
_SPLIT_COLS_LEN = 256       # reduced rows per split when few columns are very tall

MODULE = CudaModule(
    __file__,
    "reduction.cu",
    [f"reduce_rows<{cuda_name(a)}, {cuda_name(b)}, {op}, {tpr}>" for a, b in _PAIRS
     for op in range(len(COMBINES)) for tpr in (32, 256)]
    + [f"reduce_{k}<{cuda_name(a)}, {cuda_name(b)}, {op}>" for k in ("cols", "general")
       for a, b in _PAIRS for op in range(len(COMBINES))]
    + ["global_l2_norm<float>", "global_l2_norm<double>"],
    options=(f"-DGPUPLAN_NORM_CHUNK={NORM_CHUNK}",),
    enums={"Combine": COMBINES, "NormType": tuple(short_name(d) for d in NORM_DTYPES)},
)


def thread_per_output_grid(n: int) -> int:
    """Blocks of 256 threads for one thread per output of `n`, capped (grid-stride beyond)."""
    return max(1, min(cdiv(n, 256), _MAX_GRID))


def align256(n: int) -> int:
    return -(-n // 256) * 256


def normalize_axes(op: str, shape: tuple, axes: Any) -> tuple[int, ...]:
    """Sorted non-negative axes; InvalidProblem for out-of-range or repeated axes."""
    nd = len(shape)
    if axes is None:
        return tuple(range(nd))
    raw = (axes,) if isinstance(axes, (int, np.integer)) else tuple(axes)
    out = []
    for a in raw:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not -nd <= a < nd:
            raise InvalidProblem(describe(op, "axes", f"ints in [-{nd}, {nd})", axes))
        out.append(int(a) % nd)
    if len(set(out)) != len(out):
        raise InvalidProblem(describe(op, "axes", "distinct axes", axes))
    return tuple(sorted(out))


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
        return align256(self.n_out * self.split * acc_itemsize) if self.split > 1 else 0


@functools.lru_cache(maxsize=1024)
def reduce_layout(shape: tuple, axes: frozenset) -> ReduceLayout:
    """Collapse size-1 dims and merge neighbours of the same kind, then pick a kernel."""
    n_out = math.prod(e for i, e in enumerate(shape) if i not in axes)
    n_red = math.prod(e for i, e in enumerate(shape) if i in axes)
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
    strides = [math.prod(ext[i + 1:]) for i in range(len(ext))]
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


# -- launches ----------------------------------------------------------------------------


class ReduceLaunch:
    """The one or two kernel launches that reduce with `layout` from `tin` to `tout`:
    kernel names, grids and scalar arguments derived once; `run` only binds the arrays.

    `divisor` divides sums (1: sum, the count: mean, -1: a negated sum). A split layout
    writes its partials (accumulator dtype) into the workspace, then reduces them.
    """

    __slots__ = ("steps", "part")

    def __init__(self, layout: ReduceLayout, combine: int, tin: Any, tout: Any,
                 divisor: float) -> None:
        tin, tout = as_dtype(tin), as_dtype(tout)
        acc = accumulator(tout)
        div = acc.type(divisor)
        if layout.split == 1:
            self.steps = (_step(layout, combine, tin, tout, div),)
            self.part = None
            return
        s = layout.split
        if layout.kind == "rows":
            second = ReduceLayout("rows", layout.n_out, s, (layout.dims[0], s))
        else:
            outer, _, inner = layout.dims
            second = ReduceLayout("cols", layout.n_out, s, (outer, s, inner))
        # Partials in ascending split order, then reduced in that order.
        self.steps = (_step(layout, combine, tin, acc, acc.type(1)),
                      _step(second, combine, acc, tout, div))
        self.part = (acc, layout.n_out * s)

    def run(self, stream: Stream, x: Any, y: Any, ws: Workspace, ws_offset: int = 0) -> None:
        dev = stream.device_id
        if self.part is None:
            name, grid, params = self.steps[0]
            launch(stream, MODULE.function(name, dev), grid, 256, (x, y, *params))
            return
        part = ws.view(self.part[0], self.part[1], ws_offset)
        (n1, g1, p1), (n2, g2, p2) = self.steps
        launch(stream, MODULE.function(n1, dev), g1, 256, (x, part, *p1))
        launch(stream, MODULE.function(n2, dev), g2, 256, (part, y, *p2))


def _step(layout: ReduceLayout, combine: int, tin: np.dtype, tout: np.dtype,
          div: np.generic) -> tuple[str, int, tuple]:
    """(kernel name, grid, arguments after x and y) of one pass over `layout`."""
    names = f"{cuda_name(tin)}, {cuda_name(tout)}, {combine}"
    i64 = np.int64
    split = layout.split > 1
    if layout.kind == "rows":
        rows, cols = layout.dims
        s, seg = (layout.split, layout.split_len) if split else (1, max(cols, 1))
        tpr = 256 if split or cols > 1024 else 32
        grid = min(cdiv(rows * s, 256 // tpr), _MAX_GRID)
        return (f"reduce_rows<{names}, {tpr}>", grid,
                (i64(rows), i64(cols), i64(s), i64(seg), div))
    if layout.kind == "cols":
        outer, r, inner = layout.dims
        s, seg = (layout.split, layout.split_len) if split else (1, r)
        grid = min(cdiv(outer * s * inner, 256), _MAX_GRID)
        return (f"reduce_cols<{names}>", grid,
                (i64(outer), i64(r), i64(inner), i64(s), i64(seg), div))
    shape, strides, nk = layout.dims
    pad = _MAX_DIMS - len(shape)
    grid = min(cdiv(layout.n_out, 256), _MAX_GRID)
    return (f"reduce_general<{names}>", grid,
            (i64(layout.n_out), i64(layout.n_red), np.int32(nk), np.int32(len(shape) - nk),
             *(i64(e) for e in shape + (1,) * pad), *(i64(e) for e in strides + (0,) * pad),
             div))


@functools.lru_cache(maxsize=1024)
def reduce_launch(layout: ReduceLayout, combine: int, tin: Any, tout: Any,
                  divisor: float) -> ReduceLaunch:
    """The `ReduceLaunch` of these parameters (built once, then cached)."""
    return ReduceLaunch(layout, combine, tin, tout, divisor)


def launch_reduce(stream: Stream, layout: ReduceLayout, op_code: int, x: Any, y: Any,
                  divisor: float, ws: Workspace, ws_offset: int = 0) -> None:
    """Reduce device array `x` into `y` (contiguous, n_out elements) following `layout`;
    `op_code` indexes `COMBINES` (`SUM` == 0). Partials of a split layout use
    `layout.workspace_bytes(...)` bytes of `ws` from `ws_offset`."""
    reduce_launch(layout, op_code, x.dtype, y.dtype, float(divisor)).run(stream, x, y, ws,
                                                                         ws_offset)


# -- one dim of a tensor as [outer, length, inner] (reduce_dim, prod_backward) -----------


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


def kept_shape(shape: tuple, dim: int | None, keepdim: bool) -> tuple:
    if dim is None or not shape:
        return (1,) * len(shape) if keepdim else ()
    d = int(dim) % len(shape)
    return shape[:d] + ((1,) if keepdim else ()) + shape[d + 1:]
