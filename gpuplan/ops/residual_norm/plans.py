"""Residual add + LayerNorm over the last axis, one pass over the rows (a pre-LN transformer's
``s = x + f(x)`` feeding the next LayerNorm):

  forward:  s = x + residual (rounded to the dtype; written: it is the next residual),
            y = (s - mean) * rstd * weight + bias with the statistics of
            gpuplan.ops.normalization.plans's LayerNorm of s (mean, rstd saved, f32 or f64)
  backward: dx = LayerNorm's input gradient at s + ds, for x and residual alike (ds: the
            gradient reaching s from its other use, optional); dweight = sum_r dy * shat,
            dbias = sum_r dy (shat = (s - mean) * rstd).

The plans are the LayerNorm family's (gpuplan.ops.normalization.plans) with the add folded in:
the same SKUs and launch geometry; on the host, its host math (gpuplan.ops.normalization.host) with
the adds rounded as the binary add plan rounds them, so host results are the composed ops'
bit for bit; on a GPU the kernels make the same passes and row sums as norm_forward /
norm_backward_dx, and round dx once. Parameter gradients are
deterministic (gpuplan_norm.cuh's two-stage sums, no atomics).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan.dtypes import FLOAT_DTYPES, accumulator, cuda_name
from gpuplan.execute import call
from gpuplan.nvrtc import CudaModule, launch
from gpuplan.ops.normalization import host as norm_host
from gpuplan.ops.normalization.plans import _PG_COLS, _PG_ROWS, _NormBackwardPlan, _NormForwardPlan

# The LayerNorm family's plans (SKUs, launch geometry, workspace, host math): the fused op
# computes what the composed one does.
from gpuplan.ops.normalization.rows import rows_view as _rows
from gpuplan.ops.normalization.rows import stat_error
from gpuplan.spec import DType, Extent, Flag, In, OpSpec, Out, Real
from gpuplan.stream import Stream, Workspace

__all__ = [
    "ResidualLayerNormDescriptor", "ResidualLayerNormArgs", "ResidualLayerNormPlan",
    "ResidualLayerNormBackwardDescriptor", "ResidualLayerNormBackwardArgs",
    "ResidualLayerNormBackwardPlan",
]
__functional__ = ["residual_layer_norm", "residual_layer_norm_backward"]

_BOOL = ("false", "true")
_MODULE = CudaModule(
    __file__,
    "residual_norm.cu",
    [f"residual_norm_{k}<{cuda_name(t)}, {w}>" for k in ("forward", "backward_dx")
     for t in FLOAT_DTYPES for w in _BOOL]
    + [f"norm_param_grad_partial<{cuda_name(t)}, false>" for t in FLOAT_DTYPES]
    + [f"norm_param_grad_final<{cuda_name(t)}>" for t in FLOAT_DTYPES],
)


def _acc(desc: Any) -> np.dtype:
    return accumulator(desc.dtype)


_X, _VEC, _STAT = ("rows", "dim"), ("dim",), ("rows",)
_DTYPE = DType("dtype", FLOAT_DTYPES, default=np.float32)
_W, _B = Flag("has_weight", default=True), Flag("has_bias", default=True)
_IN = ("x", "residual", "weight", "bias")
FORWARD = OpSpec(
    "residual_layer_norm",
    fields=(Extent("rows"), Extent("dim"), Real("eps", default=1e-5), _W, _B, _DTYPE),
    operands=(In("x", _X), In("residual", _X), In("weight", _VEC, present="has_weight"),
              In("bias", _VEC, present="has_bias"), Out("s", _X, distinct=_IN),
              Out("y", _X, distinct=(*_IN, "s")),
              Out("mean", _STAT, _acc, distinct=(*_IN, "s", "y")),
              Out("rstd", _STAT, _acc, distinct=(*_IN, "s", "y", "mean"))))
_BW_IN = ("dy", "s", "weight", "mean", "rstd", "ds")
BACKWARD = OpSpec(
    "residual_layer_norm_backward",
    fields=(Extent("rows"), Extent("dim"), _W, _B, _DTYPE),
    operands=(In("dy", _X), In("s", _X), In("weight", _VEC, present="has_weight"),
              In("mean", _STAT, _acc), In("rstd", _STAT, _acc), In("ds", _X, present=True),
              Out("dx", _X, distinct=_BW_IN),
              Out("dweight", _VEC, present="has_weight", distinct=(*_BW_IN, "dx")),
              Out("dbias", _VEC, present="has_bias", distinct=(*_BW_IN, "dx", "dweight"))))

ResidualLayerNormDescriptor = FORWARD.descriptor(
    "ResidualLayerNormDescriptor", "s = x + residual and LayerNorm(s) of [rows, dim].")
ResidualLayerNormArgs = FORWARD.args(
    "ResidualLayerNormArgs", "x, residual, s, y [rows, dim]; weight, bias [dim] or None; "
    "mean, rstd [rows] (accumulator dtype).")
ResidualLayerNormBackwardDescriptor = BACKWARD.descriptor(
    "ResidualLayerNormBackwardDescriptor",
    "Gradients of residual_layer_norm (has_*: the parameter gradients written).")
ResidualLayerNormBackwardArgs = BACKWARD.args(
    "ResidualLayerNormBackwardArgs", "dy, s, dx [rows, dim]; mean, rstd [rows] from the "
    "forward; ds [rows, dim] or None; weight, dweight, dbias [dim] or None.")


class ResidualLayerNormPlan(_NormForwardPlan):
    """s = x + residual, y = LayerNorm(s); mean and rstd saved (see the module docstring)."""

    op = "residual_layer_norm"
    spec = FORWARD

    def _prepare(self) -> None:
        super()._prepare()
        self._kernel = f"residual_norm_forward<{self._t}, {self._warp}>"

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        norm_host.forward(args.x, args.weight, args.bias if self._has_bias else None, args.y,
                          args.mean, args.rstd, self.desc.eps, False, residual=args.residual,
                          s=args.s)

    def _run_warp_row(self, stream: Stream, ws: Workspace, args: Any) -> None:
        launch(stream, _MODULE.function(self._kernel, stream.device_id), *self._rows_launch,
               (args.x, args.residual, args.weight, args.bias, args.s, args.y, args.mean,
                args.rstd, *self._extents, self._eps))

    _run_block_row = _run_warp_row


class ResidualLayerNormBackwardPlan(_NormBackwardPlan):
    """dx (= d residual) = LayerNorm's input gradient at s + ds; dweight, dbias as asked."""

    op = "residual_layer_norm_backward"
    spec = BACKWARD

    def _prepare(self) -> None:
        super()._prepare()  # the parameter-gradient kernels keep their names (gpuplan_norm.cuh)
        self._dx_kernel = f"residual_norm_backward_dx<{self._t}, {self._warp}>"

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        norm_host.backward(args.dy, args.s, args.weight, args.mean, args.rstd, args.dx,
                           args.dweight, args.dbias if self._has_bias else None, False,
                           ds=args.ds)

    def _run_device(self, stream: Stream, ws: Workspace, args: Any) -> None:
        dev = stream.device_id
        if self.desc.rows > 0:
            launch(stream, _MODULE.function(self._dx_kernel, dev), *self._rows_launch,
                   (args.dy, args.s, args.weight, args.mean, args.rstd, args.ds, args.dx,
                    *self._extents))
        dbias = args.dbias if self._has_bias else None
        if args.dweight is None and dbias is None:
            return
        parts, n = self._parts
        part_w = ws.view(self._acc, n, 0) if args.dweight is not None else None
        part_b = None
        if dbias is not None:
            part_b = ws.view(self._acc, n, 0 if part_w is None else n * self._acc.itemsize)
        launch(stream, _MODULE.function(self._partial_kernel, dev), self._partial_grid,
               (_PG_COLS, _PG_ROWS),
               (args.dy, args.s, args.mean, args.rstd, part_w, part_b, *self._extents,
                self._chunk))
        launch(stream, _MODULE.function(self._final_kernel, dev), self._final_grid, 256,
               (part_w, part_b, args.dweight, dbias, np.int64(parts), self._extents[1]))

    _run_warp_row = _run_block_row = _run_device


# -- functional API ------------------------------------------------------------------------


def residual_layer_norm(x: Any, residual: Any, weight: Any | None, bias: Any | None,
                        eps: float = 1e-5) -> tuple[Any, Any, Any, Any]:
    """(s, y [..., D], mean, rstd [...]) with s = x + residual and y = LayerNorm(s) over the
    last axis; x and residual [..., D] of one shape."""
    x2 = _rows(x)
    rows, dim = x2.shape
    desc = ResidualLayerNormDescriptor(rows, dim, eps, weight is not None, bias is not None,
                                       x.dtype)
    s, y, mean, rstd = call(ResidualLayerNormPlan, desc, like=x, x=x2,
                            residual=_rows(residual), weight=weight, bias=bias)
    lead = x.shape[:-1]
    return s.reshape(x.shape), y.reshape(x.shape), mean.reshape(lead), rstd.reshape(lead)


def residual_layer_norm_backward(dy: Any, s: Any, weight: Any | None, mean: Any, rstd: Any,
                                 ds: Any | None = None) -> tuple[Any, Any | None, Any]:
    """(dx [..., D], dweight [D] or None, dbias [D]) of residual_layer_norm: dx is the
    gradient of x and of residual alike; ds the gradient reaching s from elsewhere (None:
    none). dbias = sum of dy over rows is always returned."""
    s2 = _rows(s)
    rows, dim = s2.shape
    try:  # free when right; a mis-sized statistic is named instead of NumPy's reshape error
        mean, rstd = mean.reshape(rows), rstd.reshape(rows)
    except ValueError:
        raise stat_error("residual_layer_norm_backward", s, "s", mean=mean, rstd=rstd) from None
    desc = ResidualLayerNormBackwardDescriptor(rows, dim, weight is not None, True, s.dtype)
    dx, dweight, dbias = call(ResidualLayerNormBackwardPlan, desc, like=s, dy=_rows(dy), s=s2,
                              weight=weight, mean=mean, rstd=rstd,
                              ds=None if ds is None else _rows(ds))
    return dx.reshape(s.shape), dweight, dbias
