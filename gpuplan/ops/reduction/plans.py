"""Reductions over axes (sum, mean, max) and the one-launch global L2 norm of many tensors.

reduce:          y = op(x, axes) with NumPy's axis/keepdims semantics; mean = sum / count.
global_l2_norm:  y = sqrt(sum_i sum_j x_i[j]^2) over a list of tensors (gradient clipping),
                 scaled so that no square overflows or underflows (float64 sums).

The reductions are the rows of `reduce_launch.REDUCTIONS` (names, CUDA combine, NumPy
math); layouts and launches live in `gpuplan.ops.reduction.launch` (`reduce_layout` and
`launch_reduce` are re-exported here for the binary family). Both plans are
deterministic and bit-stable on the GPU: the order in which values are combined is a
function of the problem's shape only (logical element index, constant block sizes, fixed
split lengths), never of the grid size, the device or the scheduling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan import backend, host_jit
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name, float32, float64
from gpuplan.dtypes import short_name as sn
from gpuplan.errors import BufferTooSmall, InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.nvrtc import cdiv, launch
from gpuplan.ops.reduction.launch import (
    BY_NAME,
    COMBINES,
    MODULE,
    NORM_CHUNK,
    NORM_CODES,
    align256,
    host_column_sums,
    normalize_axes,
    reduce_launch,
    reduce_layout,
)

# Importable from here as before the split (binary.py, kernel cases, tests).
from gpuplan.ops.reduction.launch import REDUCE_OPS as REDUCE_OPS
from gpuplan.ops.reduction.launch import REDUCTIONS as REDUCTIONS
from gpuplan.ops.reduction.launch import ReduceLayout as ReduceLayout
from gpuplan.ops.reduction.launch import launch_reduce as launch_reduce
from gpuplan.plan import (
    BackendKind,
    Candidate,
    Plan,
    check_dtype,
    check_operand,
    host_candidate,
)
from gpuplan.resolve import array_type_of as _array_type  # a stream's array class
from gpuplan.spec import (
    Choice,
    DType,
    Extent,
    Flag,
    In,
    OpSpec,
    Out,
    Shape,
    Value,
)
from gpuplan.stream import Stream, Workspace, upload

__all__ = [
    "ReduceDescriptor",
    "ReduceArgs",
    "ReducePlan",
    "GlobalNormDescriptor",
    "GlobalNormArgs",
    "GlobalNormPlan",
]
__functional__ = ["reduce", "global_l2_norm"]


# -- reduce ------------------------------------------------------------------------------


def _reduced_axes(desc: Any) -> tuple[int, ...]:
    return normalize_axes("reduce", tuple(desc.shape), desc.axes)


def _out_shape(desc: Any) -> tuple[int, ...]:
    axes = _reduced_axes(desc)
    if desc.keepdims:
        return tuple(1 if i in axes else int(e) for i, e in enumerate(desc.shape))
    return tuple(int(e) for i, e in enumerate(desc.shape) if i not in axes)


REDUCE = OpSpec(
    "reduce",
    fields=(Choice("op", REDUCE_OPS), Shape("shape"), Value("axes", default=None),
            Flag("keepdims", default=False), DType("dtype", FLOAT_DTYPES, default=np.float32)),
    operands=(In("x", lambda d: tuple(d.shape)), Out("y", _out_shape)),
)
ReduceDescriptor = REDUCE.descriptor(
    "ReduceDescriptor", "y = op(x[shape], axes) for op in REDUCE_OPS; axes: an int, a tuple "
    "of ints or None (all); keepdims as in NumPy.")
ReduceDescriptor.reduced_axes = _reduced_axes
ReduceDescriptor.out_shape = _out_shape
ReduceArgs = REDUCE.args("ReduceArgs", "x [shape] (C-contiguous), y [desc.out_shape()].")


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
    spec = REDUCE

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        axes = _reduced_axes(desc)
        if not BY_NAME[desc.op].has_identity and math.prod(
                desc.shape[a] for a in axes) == 0 and math.prod(_out_shape(desc)) > 0:
            raise InvalidProblem(describe(cls.op, "shape",
                                          f"non-empty reduced axes for {desc.op}", desc.shape))

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        lay = reduce_layout(tuple(int(e) for e in desc.shape), frozenset(_reduced_axes(desc)))
        acc = accumulator(d)
        return [Candidate(lay.kind, BackendKind.NVRTC, True, True, sn(d), sn(acc),
                          lay.workspace_bytes(acc.itemsize))]

    def _prepare(self) -> None:
        d = self.desc
        shape = tuple(int(e) for e in d.shape)
        self._axes = _reduced_axes(d)
        self._red = BY_NAME[d.op]
        self._acc = accumulator(d.dtype)
        count = math.prod(shape[a] for a in self._axes)
        self._divisor = float(count) if self._red.mean else 1.0
        # Sum / mean of f32 over leading axes (a bias gradient): the compiled column sums.
        # Not for one kept element: NumPy then sums the squeezed vector pairwise.
        k = len(self._axes)
        self._columns = None
        if (d.op in ("sum", "mean") and as_dtype(d.dtype) == float32 and 0 < k < len(shape)
                and self._axes == tuple(range(k)) and math.prod(shape[k:]) > 1):
            self._columns = (math.prod(shape[:k]), math.prod(shape[k:]))
        if not self._stream.is_host:
            self._launch = reduce_launch(reduce_layout(shape, frozenset(self._axes)),
                                         COMBINES.index(self._red.combine), d.dtype, d.dtype,
                                         self._divisor)

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        acc = self._acc
        if self._columns is not None and host_jit.takes(args.x):
            r = host_column_sums(args.x.reshape(self._columns))
            if r is not None:
                if self._red.mean:
                    with np.errstate(invalid="ignore", divide="ignore"):
                        r /= acc.type(self._divisor)
                args.y[...] = r.reshape(args.y.shape)
                return
        r = self._red.host(args.x.astype(acc, copy=False), self._axes, self.desc.keepdims)
        if self._red.mean:
            with np.errstate(invalid="ignore", divide="ignore"):
                r = r / acc.type(self._divisor)
        args.y[...] = np.asarray(r).astype(self.desc.dtype)

    def _run_device(self, stream: Stream, ws: Workspace, args: Any) -> None:
        self._launch.run(stream, args.x, args.y, ws)

    _run_rows = _run_cols = _run_general = _run_device


# -- global L2 norm ------------------------------------------------------------------------


def _norm_dtype(desc: Any) -> np.dtype:
    return float64 if any(as_dtype(t) == float64 for t in desc.dtypes) else float32


GLOBAL_NORM = OpSpec(
    "global_l2_norm",
    fields=(Value("sizes"), Value("dtypes")),
    # `arrays`, a list of any length, is beyond a declaration: GlobalNormPlan._check_args.
    operands=(Out("out", (), dtype=_norm_dtype),),
    empty=lambda desc: False,  # no tensor (or only empty ones): out = 0 is still written
)
GlobalNormDescriptor = GLOBAL_NORM.descriptor(
    "GlobalNormDescriptor", "sqrt of the sum of squares of every element of len(sizes) "
    "tensors: sizes[i] elements of dtypes[i]; out is f32, or f64 if any tensor is.")
GlobalNormDescriptor.out_dtype = _norm_dtype


@dataclass(slots=True)
class GlobalNormArgs:
    """arrays: len(sizes) C-contiguous arrays (arrays[i].size == sizes[i], dtype dtypes[i],
    any shape); out: 0-d array of desc.out_dtype()."""

    arrays: tuple
    out: Any


GLOBAL_NORM.args_cls = GlobalNormArgs


class GlobalNormPlan(Plan):
    """One launch over all tensors: per-chunk partial sums of squares in the workspace, then
    the last block to finish sums them in chunk order (deterministic, bit-stable)."""

    op = "global_l2_norm"
    category = "reduction"
    spec = GLOBAL_NORM

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        sizes, dtypes = tuple(desc.sizes), tuple(desc.dtypes)
        if len(sizes) != len(dtypes):
            raise InvalidProblem(describe(cls.op, "dtypes", f"{len(sizes)} dtypes "
                                          "(one per size)", len(dtypes)))
        for i, (s, t) in enumerate(zip(sizes, dtypes, strict=True)):
            Extent(f"sizes[{i}]").check(cls.op, s)
            DType(f"dtypes[{i}]", FLOAT_DTYPES).check(cls.op, t)

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        out = sn(_norm_dtype(desc))
        if stream.is_host:
            return [Candidate("numpy", BackendKind.NUMPY, True, True, "mixed", out)]
        n_chunks = sum(cdiv(int(s), NORM_CHUNK) for s in desc.sizes)
        ws = _table_bytes(len(desc.sizes)) + align256(max(n_chunks, 1) * 3 * 8)
        return [Candidate("chunked", BackendKind.NVRTC, True, True, "mixed", out, ws)]

    def _prepare(self) -> None:
        d = self.desc
        self._sizes = tuple(int(s) for s in d.sizes)
        self._dtypes = tuple(as_dtype(t) for t in d.dtypes)
        self._out = _norm_dtype(d)
        n = len(self._sizes)
        chunks = [cdiv(s, NORM_CHUNK) for s in self._sizes]
        self._n_chunks = sum(chunks)
        # ptr[n] (filled per call), size[n], code[n], chunk prefix[n + 1], a zeroed counter.
        table = np.zeros(4 * n + 2, dtype=np.int64)
        table[n:2 * n] = self._sizes
        table[2 * n:3 * n] = [NORM_CODES[t] for t in self._dtypes]
        table[3 * n + 1:4 * n + 1] = np.cumsum(chunks, dtype=np.int64)
        self._table = table
        self._kernel = f"global_l2_norm<{cuda_name(self._out)}>"
        self._grid = max(1, min(self._n_chunks, 1024))

    def _sku_dtype(self) -> Any:
        return self._out

    def _check_args(self, args: Any) -> None:
        """The `arrays` list: its length, then each array's side, dtype, size and layout
        (a few attribute reads per array; `_explain` raises the precise error)."""
        arrays = args.arrays
        if len(arrays) != len(self._sizes):
            raise InvalidProblem(describe(self.op, "arrays", f"{len(self._sizes)} arrays",
                                          len(arrays)))
        array_type, host = _array_type(self._stream.kind), self._stream.is_host
        device_id = self._stream.device_id if self._stream.kind == "cuda" else None
        for i, a in enumerate(arrays):
            t = self._dtypes[i]
            if type(a) is not array_type or a.dtype != t or a.size != self._sizes[i] or \
                    not a.flags.c_contiguous:
                self._explain(i, a)
            if host:
                if not a.flags.aligned:
                    self._explain(i, a)
            elif (device_id is not None and a.data.device_id != device_id) or \
                    a.data.ptr % t.itemsize:
                self._explain(i, a)

    def _explain(self, i: int, a: Any) -> None:
        name, s, t = f"arrays[{i}]", self._sizes[i], self._dtypes[i]
        stream = self._stream
        if not hasattr(a, "shape") or backend.device_of(a) != stream.kind:
            raise InvalidProblem(describe(self.op, name, f"an array on the plan's stream "
                                          f"({stream.kind})", type(a).__name__))
        if stream.kind == "cuda" and a.data.device_id != stream.device_id:
            raise InvalidProblem(describe(self.op, name, f"an array on device "
                                          f"{stream.device_id}", a.data.device_id))
        check_dtype(self.op, name, a.dtype, (t,))
        if a.size != s:
            error = BufferTooSmall if a.size < s else InvalidProblem
            raise error(describe(self.op, name, f"{s} elements", a.size))
        check_operand(self.op, name, a, a.shape, t)  # layout and alignment

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        # The fast dot products may overflow: _sums_of_squares then takes the scaled path; a
        # norm beyond f32's range is inf, as on a GPU.
        with np.errstate(over="ignore", under="ignore"):
            sums = [_sums_of_squares(a, self._out) for a in args.arrays]
            args.out[...] = _norm_from_sums(*(math.fsum(s[k] for s in sums) for k in range(3)))

    def _run_chunked(self, stream: Stream, ws: Workspace, args: Any) -> None:
        n = len(self._sizes)
        table = self._table.copy()
        table[:n] = [a.data.ptr for a in args.arrays]
        dev_table = ws.view(np.int64, table.size, 0)
        upload(stream, dev_table, table)  # (a snapshot the graph owns while capturing)
        # (small, middle, big) sums of squares per chunk, in float64 (see reduction.cu).
        partials = ws.view(float64, 3 * max(self._n_chunks, 1), _table_bytes(n))
        launch(stream, MODULE.function(self._kernel, stream.device_id), self._grid, 256,
               (dev_table, np.int32(n), partials, args.out), reachable=args.arrays)


def _table_bytes(n: int) -> int:
    return align256((4 * n + 2) * 8)


# Blue's thresholds and scales for float64 (LAPACK's dnrm2), as reduction.cu's kNorm*: the
# squares of |x| > _TBIG are summed scaled by _SBIG, of |x| < _TSML by _SSML (exact powers
# of two), so no square overflows or underflows.
_TSML, _TBIG, _SSML, _SBIG = 2.0 ** -511, 2.0 ** 486, 2.0 ** 537, 2.0 ** -538


def _sums_of_squares(a: np.ndarray, acc: np.dtype) -> tuple[float, float, float]:
    """(small, middle, big) scaled sums of squares of a's elements, as global_l2_norm's
    kernel splits them. A plain dot product in `acc` (the norm's dtype) first, the fast CPU
    path: kept when finite and not so small that underflowed squares could matter."""
    v = np.ravel(a)
    if acc == float32:
        v = v.astype(float32, copy=False)
        s = float(np.dot(v, v))
        if math.isfinite(s) and s >= 2.0 ** -60:
            return 0.0, s, 0.0
        # f32/half values squared are always finite and normal in float64: blockwise sums.
        step = 1 << 16
        return 0.0, math.fsum(float(np.dot(w, w)) for w in (
            v[i:i + step].astype(float64) for i in range(0, v.size, step))), 0.0
    v = v.astype(float64, copy=False)
    s = float(np.dot(v, v))
    if math.isfinite(s) and s >= 2.0 ** -900:
        return 0.0, s, 0.0
    ax = np.abs(v)
    big, sml = ax > _TBIG, ax < _TSML
    mid = v[~(big | sml)]  # NaN compares false both ways: it lands here and propagates
    vb, vs = v[big] * _SBIG, v[sml] * _SSML
    return float(np.dot(vs, vs)), float(np.dot(mid, mid)), float(np.dot(vb, vb))


def _norm_from_sums(sml: float, med: float, big: float) -> float:
    """The norm from the three sums (reduction.cu's norm_combine, LAPACK's combination)."""
    has_med = med > 0.0 or med != med
    if big > 0.0:
        if has_med:
            big += (med * _SBIG) * _SBIG
        return math.sqrt(big) / _SBIG
    if sml > 0.0:
        if not has_med:
            return math.sqrt(sml) / _SSML
        ymed, ysml = math.sqrt(med), math.sqrt(sml) / _SSML
        ymin, ymax = (ymed, ysml) if ysml > ymed else (ysml, ymed)
        return ymax * math.sqrt(1.0 + (ymin / ymax) ** 2)
    return math.sqrt(med)


# -- functional API ------------------------------------------------------------------------


def reduce(name: str, x: Any, axes: Any = None, keepdims: bool = False) -> Any:
    """y = sum/mean/max of x over `axes` (int, tuple or None: all); y.dtype == x.dtype."""
    if isinstance(axes, list):
        axes = tuple(axes)
    desc = ReduceDescriptor(name, x.shape, axes, keepdims, x.dtype)
    return call(ReducePlan, desc, like=x, x=backend.ascontiguous(x))


def global_l2_norm(arrays: list) -> Any:
    """0-d sqrt(sum of squares of all elements of all arrays): f32, or f64 if any input is."""
    arrays = tuple(backend.ascontiguous(a) for a in arrays)
    if not arrays:
        return np.zeros((), dtype=np.float32)
    desc = GlobalNormDescriptor(tuple(a.size for a in arrays), tuple(a.dtype for a in arrays))
    return call(GlobalNormPlan, desc, like=arrays[0], arrays=arrays)
