"""Selection: where(cond, a, b) with NumPy broadcasting, and the triangles tril / triu.

where:     out = cond ? a : b elementwise over broadcast(cond_shape, a_shape, b_shape);
           cond is bool. It is masked_fill (a = the fill value as a 0-d array) and the
           backward of both (the gradient routed to one side, zeros to the other).
triangle:  y[n, i, j] = x[n, i, j] where j - i <= diagonal (part "lower", tril) or
           j - i >= diagonal (part "upper", triu), else 0; batched over n. Its backward is
           the same triangle of dy.

Pure data movement: every value is copied bit for bit (NaN included), for the float dtypes,
int32, int64 and bool (a causal mask is tril of a bool matrix). Deterministic, bit-stable.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, as_dtype, cuda_name, int32, int64
from gpuplan.dtypes import short_name as sn
from gpuplan.errors import Unsupported, describe
from gpuplan.execute import call
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.ops.broadcast import MAX_DIMS, broadcast_layout, dims_launch_args
from gpuplan.plan import BackendKind, Candidate, Plan
from gpuplan.spec import Choice, DType, Extent, In, Index, OpSpec, Out, Shape
from gpuplan.stream import Stream, Workspace

__all__ = ["WhereDescriptor", "WhereArgs", "WherePlan", "TriangleDescriptor", "TriangleArgs",
           "TrianglePlan"]
__functional__ = ["where", "triangle"]

BOOL = np.dtype(np.bool_)
#: Dtypes of the selected values (cond is always bool).
SELECT_DTYPES: tuple[np.dtype, ...] = FLOAT_DTYPES + (int32, int64, BOOL)
PARTS = ("lower", "upper")
_MAX_GRID = 1 << 18


def _ctype(d: Any) -> str:
    d = as_dtype(d)
    return "bool" if d == BOOL else cuda_name(d)


_MODULE = CudaModule(
    __file__, "select.cu",
    [f"where_broadcast<{_ctype(t)}>" for t in SELECT_DTYPES]
    + [f"triangle<{_ctype(t)}, {u}>" for t in SELECT_DTYPES for u in ("false", "true")],
)


def _grid(work: int) -> int:
    return max(1, min(cdiv(work, 256), _MAX_GRID))


def where_layout(op: str, desc: Any) -> tuple[tuple, tuple]:
    """(out_shape, collapsed dims (extent, cond, a, b strides)) of a WhereDescriptor."""
    return broadcast_layout(op, ("cond_shape", "a_shape", "b_shape"),
                            (desc.cond_shape, desc.a_shape, desc.b_shape))


def _out_shape(desc: Any) -> tuple:
    return where_layout("where", desc)[0]


class _SelectPlan(Plan):
    category = "elementwise"

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = sn(desc.dtype)
        backend_kind = BackendKind.NUMPY if stream.is_host else BackendKind.NVRTC
        return [Candidate("numpy" if stream.is_host else "map", backend_kind, True, True, d, d)]


# -- where ---------------------------------------------------------------------------------

WHERE = OpSpec("where", fields=(Shape("cond_shape"), Shape("a_shape"), Shape("b_shape"),
                                DType("dtype", SELECT_DTYPES, default=np.float32)),
               operands=(In("cond", lambda d: d.cond_shape, dtype=BOOL),
                         In("a", lambda d: d.a_shape), In("b", lambda d: d.b_shape),
                         Out("out", _out_shape)))
WhereDescriptor = WHERE.descriptor(
    "WhereDescriptor", "out[broadcast(cond_shape, a_shape, b_shape)] = cond ? a : b.")
WhereDescriptor.out_shape = _out_shape
WhereArgs = WHERE.args("WhereArgs", "cond (bool), a, b (dtype) in their shapes; out in the "
                                    "broadcast shape.")


class WherePlan(_SelectPlan):
    """out = cond ? a : b over at most 8 collapsed broadcast dims (per-dim strides)."""

    op = "where"
    spec = WHERE

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        dims = where_layout(cls.op, desc)[1]
        if len(dims) > MAX_DIMS:
            raise Unsupported(describe(cls.op, "a_shape", f"at most {MAX_DIMS} dims after "
                                                          f"collapsing", f"{len(dims)} dims"))

    def _prepare(self) -> None:
        out, dims = where_layout(self.op, self.desc)
        self._n = math.prod(out)
        self._dims_args = dims_launch_args(dims, 3)
        self._kernel = f"where_broadcast<{_ctype(self.desc.dtype)}>"

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        np.copyto(args.out, np.where(args.cond, args.a, args.b))

    def _run_map(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = _MODULE.function(self._kernel, stream.device_id)
        launch(stream, fn, _grid(self._n), 256,
               (args.cond, args.a, args.b, args.out, np.int64(self._n), *self._dims_args))


# -- triangle ------------------------------------------------------------------------------

_SHAPE = ("batch", "rows", "cols")
TRIANGLE = OpSpec("triangle", fields=(Choice("part", PARTS), Extent("batch"), Extent("rows"),
                                      Extent("cols"), Index("diagonal", default=0),
                                      DType("dtype", SELECT_DTYPES, default=np.float32)),
                  operands=(In("x", _SHAPE), Out("y", _SHAPE)))
TriangleDescriptor = TRIANGLE.descriptor(
    "TriangleDescriptor", "y[batch, rows, cols] = x where j - i <= diagonal (part 'lower') or "
                          "j - i >= diagonal (part 'upper'), else 0.")
TriangleArgs = TRIANGLE.args("TriangleArgs", "x, y [batch, rows, cols].")


class TrianglePlan(_SelectPlan):
    """tril / triu of a batch of matrices (one thread per element, grid-stride)."""

    op = "triangle"
    spec = TRIANGLE

    def _prepare(self) -> None:
        d = self.desc
        self._n = d.batch * d.rows * d.cols
        upper = "true" if d.part == "upper" else "false"
        self._kernel = f"triangle<{_ctype(d.dtype)}, {upper}>"

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        tri = np.triu if self.desc.part == "upper" else np.tril
        np.copyto(args.y, tri(args.x, self.desc.diagonal))

    def _run_map(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        # a diagonal beyond +-(rows + cols) selects all or nothing: clamp it into int range
        k = max(-(d.rows + 1), min(d.cols + 1, d.diagonal))
        fn = _MODULE.function(self._kernel, stream.device_id)
        launch(stream, fn, _grid(self._n), 256,
               (args.x, args.y, np.int64(self._n), np.int64(d.rows), np.int64(d.cols),
                np.int64(k)))


# -- functional API ------------------------------------------------------------------------


def where(cond: Any, a: Any, b: Any) -> Any:
    """cond ? a : b with NumPy broadcasting (cond bool; a and b of one dtype)."""
    cond, a, b = (backend.ascontiguous(v) for v in (cond, a, b))
    desc = WhereDescriptor(tuple(cond.shape), tuple(a.shape), tuple(b.shape), a.dtype)
    return call(WherePlan, desc, like=a, cond=cond, a=a, b=b)


def triangle(part: str, x: Any, diagonal: int = 0) -> Any:
    """tril (part "lower") or triu ("upper") over the last two dims of x (ndim >= 2)."""
    if x.ndim < 2:
        raise Unsupported(describe("triangle", "x", "an array of at least 2 dims",
                                   f"shape {tuple(x.shape)}"))
    rows, cols = int(x.shape[-2]), int(x.shape[-1])
    batch = math.prod(x.shape[:-2])
    flat = backend.ascontiguous(x).reshape(batch, rows, cols)
    y = call(TrianglePlan, TriangleDescriptor(part, batch, rows, cols, int(diagonal), x.dtype),
             like=x, x=flat)
    return y.reshape(x.shape)
