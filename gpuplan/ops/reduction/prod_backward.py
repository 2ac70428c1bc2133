"""The gradient of a product along one dim: dx[o, r, i] = dy[o, i] * prod_{r' != r} x[o, r', i]
for x viewed as [outer, length, inner], zeros handled exactly (no division where x is 0)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name
from gpuplan.dtypes import short_name as sn
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.nvrtc import CudaModule, launch
from gpuplan.ops.reduction.launch import dim_view, kept_shape, thread_per_output_grid
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import DType, Extent, In, OpSpec, Out
from gpuplan.stream import Stream, Workspace

__all__ = ["ProdBackwardDescriptor", "ProdBackwardArgs", "ProdBackwardPlan"]
__functional__ = ["prod_backward"]

_DTYPE = DType("dtype", FLOAT_DTYPES, default=np.float32)
_ROW = (Extent("outer"), Extent("length"), Extent("inner"))
_X = In("x", ("outer", "length", "inner"))

MODULE = CudaModule(__file__, "prod_backward.cu",
                    [f"prod_backward<{cuda_name(t)}>" for t in FLOAT_DTYPES])


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
        self._grid = thread_per_output_grid(d.outer * d.inner)
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


# -- functional API ----------------------------------------------------------------------


def prod_backward(x: Any, dy: Any, dim: int | None = None) -> Any:
    """dx (x's shape) of y = prod(x, dim) from dy (y's shape, kept dim or not)."""
    o, n, i = dim_view("prod_backward", x.shape, dim)
    try:  # free when right: a mis-shaped dy is named, not NumPy's reshape error
        dy = backend.ascontiguous(dy).reshape(o, i)
    except ValueError:
        want = f"shape {kept_shape(x.shape, dim, False)} (dim kept or not)"
        raise InvalidProblem(describe("prod_backward", "dy", want, f"shape {dy.shape}")) from None
    dx = call(ProdBackwardPlan, ProdBackwardDescriptor(o, n, i, x.dtype), like=x,
              x=backend.ascontiguous(x).reshape(o, n, i), dy=dy)
    return dx.reshape(x.shape)
