"""LayerNorm and RMSNorm over the last axis (forward, input and parameter gradients).

Rows are x[r, :] of a [rows, dim] view; statistics are float32 (float64 for f64 inputs):
  LayerNorm: mean = sum_d x / D, rstd = 1 / sqrt(sum_d (x - mean)^2 / D + eps),
             y = (x - mean) * rstd * weight + bias
  RMSNorm:   rstd = 1 / sqrt(sum_d x^2 / D + eps), y = x * rstd * weight
Backward (g = dy * weight, xhat = (x - mean) * rstd, mean = 0 for RMSNorm):
  dx = rstd * (g - mean_d(g) - xhat * mean_d(g * xhat))   (RMSNorm: no mean_d(g) term)
  dweight = sum_r dy * xhat, dbias = sum_r dy (written, not accumulated).
Parameter gradients are deterministic on the GPU: per-chunk partial sums go to the
workspace and a second kernel adds them in a fixed order (no atomics). Host: cache-sized row
blocks over the host threads, float32 by compiled one-pass kernels when numba is there
(gpuplan.ops.normalization.host); the parameter gradients add per-block partial sums in block order
(bit-identical for any thread count). D = 0 rows have mean 0 and rstd 1/sqrt(eps).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name, short_name
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call, interned
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.ops.normalization import host as norm_host
from gpuplan.ops.normalization.rows import rows_view as _rows
from gpuplan.ops.normalization.rows import stat_error
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import DType, Extent, Flag, In, OpSpec, Out, Real
from gpuplan.stream import Stream, Workspace

__all__ = [
    "LayerNormDescriptor", "LayerNormArgs", "LayerNormPlan",
    "LayerNormBackwardDescriptor", "LayerNormBackwardArgs", "LayerNormBackwardPlan",
    "RMSNormDescriptor", "RMSNormArgs", "RMSNormPlan",
    "RMSNormBackwardDescriptor", "RMSNormBackwardArgs", "RMSNormBackwardPlan",
]
__functional__ = ["layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward"]

_BOOL = ("false", "true")
_MODULE = CudaModule(
    __file__,
    "normalization.cu",
    [f"norm_forward<{cuda_name(t)}, {r}, {w}>" for t in FLOAT_DTYPES for r in _BOOL
     for w in _BOOL]
    + [f"norm_backward_dx<{cuda_name(t)}, {r}, {w}>" for t in FLOAT_DTYPES for r in _BOOL
       for w in _BOOL]
    + [f"norm_param_grad_partial<{cuda_name(t)}, {r}>" for t in FLOAT_DTYPES for r in _BOOL]
    + [f"norm_param_grad_final<{cuda_name(t)}>" for t in FLOAT_DTYPES],
)

#: Rows up to this length go one per warp; longer rows get a whole block.
WARP_ROW_MAX_DIM = 1024
_WARPS_PER_BLOCK = 4
_MAX_GRID = 1 << 20
_PG_COLS, _PG_ROWS = 32, 8  # NORM_PG_COLS, NORM_PG_ROWS in normalization.cu
_MAX_PARTS = 256           # row chunks of the parameter-gradient reduction


# -- declarations ---------------------------------------------------------------------------


def _acc(desc: Any) -> np.dtype:
    """dtype of the saved statistics (mean, rstd): the accumulator of the data dtype."""
    return accumulator(desc.dtype)


_X, _VEC, _STAT = ("rows", "dim"), ("dim",), ("rows",)
_DTYPE = DType("dtype", FLOAT_DTYPES, default=np.float32)
_W, _B = Flag("has_weight", default=True), Flag("has_bias", default=True)
_PARAMS = ("x", "weight", "bias")  # inputs of the forward

LAYER_NORM = OpSpec(
    "layer_norm",
    fields=(Extent("rows"), Extent("dim"), Real("eps", default=1e-5), _W, _B, _DTYPE),
    operands=(In("x", _X), In("weight", _VEC, present="has_weight"),
              In("bias", _VEC, present="has_bias"), Out("y", _X, distinct=_PARAMS),
              Out("mean", _STAT, _acc, distinct=(*_PARAMS, "y")),
              Out("rstd", _STAT, _acc, distinct=(*_PARAMS, "y", "mean"))))
RMS_NORM = OpSpec(
    "rms_norm",
    fields=(Extent("rows"), Extent("dim"), Real("eps", default=1e-6), _W, _DTYPE),
    operands=(In("x", _X), In("weight", _VEC, present="has_weight"),
              Out("y", _X, distinct=("x", "weight")),
              Out("rstd", _STAT, _acc, distinct=("x", "weight", "y"))))
_BW_INPUTS = ("dy", "x", "mean", "rstd", "weight")
LAYER_NORM_BACKWARD = OpSpec(
    "layer_norm_backward",
    fields=(Extent("rows"), Extent("dim"), _W, _B, _DTYPE),
    operands=(In("dy", _X), In("x", _X), In("weight", _VEC, present="has_weight"),
              In("mean", _STAT, _acc), In("rstd", _STAT, _acc),
              Out("dx", _X, distinct=_BW_INPUTS),
              Out("dweight", _VEC, present="has_weight", distinct=(*_BW_INPUTS, "dx")),
              Out("dbias", _VEC, present="has_bias",
                  distinct=(*_BW_INPUTS, "dx", "dweight"))))
RMS_NORM_BACKWARD = OpSpec(
    "rms_norm_backward",
    fields=(Extent("rows"), Extent("dim"), _W, _DTYPE),
    operands=(In("dy", _X), In("x", _X), In("weight", _VEC, present="has_weight"),
              In("rstd", _STAT, _acc), Out("dx", _X, distinct=("dy", "x", "rstd", "weight")),
              Out("dweight", _VEC, present="has_weight",
                  distinct=("dy", "x", "rstd", "weight", "dx"))))

LayerNormDescriptor = LAYER_NORM.descriptor("LayerNormDescriptor", "LayerNorm of [rows, dim].")
LayerNormArgs = LAYER_NORM.args(
    "LayerNormArgs", "x, y [rows, dim]; weight, bias [dim] or None; mean, rstd [rows] (acc).")
RMSNormDescriptor = RMS_NORM.descriptor("RMSNormDescriptor", "RMSNorm of [rows, dim].")
RMSNormArgs = RMS_NORM.args("RMSNormArgs", "x, y [rows, dim]; weight [dim] or None; rstd [rows].")
LayerNormBackwardDescriptor = LAYER_NORM_BACKWARD.descriptor(
    "LayerNormBackwardDescriptor", "LayerNorm gradients (has_*: the parameter grads written).")
LayerNormBackwardArgs = LAYER_NORM_BACKWARD.args(
    "LayerNormBackwardArgs", "dy, x, dx [rows, dim]; mean, rstd [rows] from the forward; "
                             "weight, dweight, dbias [dim] or None.")
RMSNormBackwardDescriptor = RMS_NORM_BACKWARD.descriptor(
    "RMSNormBackwardDescriptor", "RMSNorm gradients (has_weight: dweight written).")
RMSNormBackwardArgs = RMS_NORM_BACKWARD.args(
    "RMSNormBackwardArgs", "dy, x, dx [rows, dim]; rstd [rows]; weight, dweight [dim] or None.")


# -- launch geometry and the host math ------------------------------------------------------


def _row_launch(variant: str, rows: int, dim: int) -> tuple[int, int]:
    """(grid, block) for the row-wise kernels."""
    if variant == "warp_row":
        return max(1, min(cdiv(rows, _WARPS_PER_BLOCK), _MAX_GRID)), 32 * _WARPS_PER_BLOCK
    threads = min(512, max(128, cdiv(cdiv(dim, 8), 32) * 32))
    return max(1, min(rows, _MAX_GRID)), threads


def _n_parts(rows: int) -> int:
    return max(1, min(_MAX_PARTS, cdiv(rows, 32)))


class _NormPlan(Plan):
    """Shared by the four families: SKUs (NumPy on the host; one row per warp or per block
    on a device) and the per-plan constants."""

    category = "normalization"
    rms: bool = False
    _param_buffers = 0  # parameter-gradient partial-sum buffers in the workspace

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        acc = accumulator(d)
        n_bufs = cls._param_buffers and (int(desc.has_weight)
                                         + int(getattr(desc, "has_bias", False)))
        ws = n_bufs * _n_parts(desc.rows) * desc.dim * acc.itemsize
        # Row sums are tree reductions whose shape follows the launch: deterministic for a
        # given launch, but not bit-stable.
        variant = "warp_row" if desc.dim <= WARP_ROW_MAX_DIM else "block_row"
        return [Candidate(variant, BackendKind.NVRTC, True, False,
                          short_name(d), short_name(acc), ws)]

    def _prepare(self) -> None:
        d = self.desc
        self._acc = accumulator(d.dtype)
        self._has_bias = getattr(d, "has_bias", False)
        self._t, self._r = cuda_name(d.dtype), _BOOL[self.rms]
        variant = self._cand.variant
        self._warp = _BOOL[variant == "warp_row"]
        self._rows_launch = _row_launch(variant, d.rows, d.dim)
        self._extents = (np.int64(d.rows), np.int64(d.dim))


# -- forward ------------------------------------------------------------------------------


class _NormForwardPlan(_NormPlan):
    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        if desc.eps < 0:
            raise InvalidProblem(describe(cls.op, "eps", "a finite value >= 0", desc.eps))

    def _prepare(self) -> None:
        super()._prepare()
        self._kernel = f"norm_forward<{self._t}, {self._r}, {self._warp}>"
        self._eps = np.float64(self.desc.eps)

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        norm_host.forward(args.x, args.weight, args.bias if self._has_bias else None, args.y,
                          None if self.rms else args.mean, args.rstd, self.desc.eps, self.rms)

    def _run_warp_row(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = _MODULE.function(self._kernel, stream.device_id)
        bias, mean = (None, None) if self.rms else (args.bias, args.mean)
        launch(stream, fn, *self._rows_launch,
               (args.x, args.weight, bias, args.y, mean, args.rstd, *self._extents,
                self._eps))

    _run_block_row = _run_warp_row


class LayerNormPlan(_NormForwardPlan):
    """LayerNorm forward: y, mean, rstd from x (see the module docstring for the math)."""

    op = "layer_norm"
    spec = LAYER_NORM


class RMSNormPlan(_NormForwardPlan):
    """RMSNorm forward: y, rstd from x (see the module docstring for the math)."""

    op = "rms_norm"
    spec = RMS_NORM
    rms = True


# -- backward -----------------------------------------------------------------------------


class _NormBackwardPlan(_NormPlan):
    _param_buffers = 1

    def _prepare(self) -> None:
        super()._prepare()
        d = self.desc
        self._dx_kernel = f"norm_backward_dx<{self._t}, {self._r}, {self._warp}>"
        self._partial_kernel = f"norm_param_grad_partial<{self._t}, {self._r}>"
        self._final_kernel = f"norm_param_grad_final<{self._t}>"
        parts = _n_parts(d.rows)
        self._parts = (parts, parts * d.dim)  # count, elements of one partial-sum buffer
        self._partial_grid = (cdiv(d.dim, _PG_COLS), parts)
        self._final_grid = max(1, min(cdiv(d.dim, 256), _MAX_GRID))
        self._chunk = np.int64(max(1, cdiv(d.rows, parts)))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        norm_host.backward(args.dy, args.x, args.weight, None if self.rms else args.mean,
                           args.rstd, args.dx, args.dweight,
                           args.dbias if self._has_bias else None, self.rms)

    def _run_device(self, stream: Stream, ws: Workspace, args: Any) -> None:
        dev = stream.device_id
        mean = None if self.rms else args.mean
        if self.desc.rows > 0:
            launch(stream, _MODULE.function(self._dx_kernel, dev), *self._rows_launch,
                   (args.dy, args.x, args.weight, mean, args.rstd, args.dx, *self._extents))
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
               (args.dy, args.x, mean, args.rstd, part_w, part_b, *self._extents, self._chunk))
        launch(stream, _MODULE.function(self._final_kernel, dev), self._final_grid, 256,
               (part_w, part_b, args.dweight, dbias, np.int64(parts), self._extents[1]))

    _run_warp_row = _run_device
    _run_block_row = _run_device


class LayerNormBackwardPlan(_NormBackwardPlan):
    """LayerNorm backward: dx, and dweight / dbias as the descriptor asks."""

    op = "layer_norm_backward"
    spec = LAYER_NORM_BACKWARD


class RMSNormBackwardPlan(_NormBackwardPlan):
    """RMSNorm backward: dx, and dweight when has_weight."""

    op = "rms_norm_backward"
    spec = RMS_NORM_BACKWARD
    rms = True


# -- functional API ------------------------------------------------------------------------


def layer_norm(x: Any, weight: Any | None, bias: Any | None,
               eps: float = 1e-5) -> tuple[Any, Any, Any]:
    """LayerNorm over the last axis of x [..., D]: returns (y [..., D], mean [...], rstd [...])."""
    x2 = x if x.ndim == 2 and x.flags.c_contiguous else _rows(x)
    rows, dim = x2.shape
    desc = interned(LayerNormDescriptor, rows, dim, eps, weight is not None, bias is not None,
                    x.dtype)
    y, mean, rstd = call(LayerNormPlan, desc, like=x, x=x2, weight=weight, bias=bias)
    if x.ndim == 2:
        return y, mean, rstd
    lead = x.shape[:-1]
    return y.reshape(x.shape), mean.reshape(lead), rstd.reshape(lead)


def layer_norm_backward(dy: Any, x: Any, weight: Any | None, mean: Any,
                        rstd: Any) -> tuple[Any, Any | None, Any]:
    """(dx [..., D], dweight [D] or None, dbias [D]) of LayerNorm; dbias = sum of dy over rows
    is always returned (callers ignore it when the forward had no bias)."""
    x2 = _rows(x)
    rows, dim = x2.shape
    try:  # free when right; a mis-sized statistic is named instead of NumPy's reshape error
        mean, rstd = mean.reshape(rows), rstd.reshape(rows)
    except ValueError:
        raise stat_error("layer_norm_backward", x, "x", mean=mean, rstd=rstd) from None
    desc = interned(LayerNormBackwardDescriptor, rows, dim, weight is not None, True, x.dtype)
    dx, dweight, dbias = call(LayerNormBackwardPlan, desc, like=x, dy=_rows(dy), x=x2,
                              weight=weight, mean=mean, rstd=rstd)
    return dx.reshape(x.shape), dweight, dbias


def rms_norm(x: Any, weight: Any | None, eps: float = 1e-6) -> tuple[Any, Any]:
    """RMSNorm over the last axis of x [..., D]: returns (y [..., D], rstd [...])."""
    x2 = _rows(x)
    rows, dim = x2.shape
    desc = interned(RMSNormDescriptor, rows, dim, eps, weight is not None, x.dtype)
    y, rstd = call(RMSNormPlan, desc, like=x, x=x2, weight=weight)
    return y.reshape(x.shape), rstd.reshape(x.shape[:-1])


def rms_norm_backward(dy: Any, x: Any, weight: Any | None, rstd: Any) -> tuple[Any, Any | None]:
    """(dx [..., D], dweight [D] or None) of RMSNorm."""
    x2 = _rows(x)
    rows, dim = x2.shape
    try:
        rstd2 = rstd.reshape(rows)
    except ValueError:
        raise stat_error("rms_norm_backward", x, "x", rstd=rstd) from None
    desc = interned(RMSNormBackwardDescriptor, rows, dim, weight is not None, x.dtype)
    dx, dweight = call(RMSNormBackwardPlan, desc, like=x, dy=_rows(dy), x=x2, weight=weight,
                       rstd=rstd2)
    return dx.reshape(x.shape), dweight
