"""LayerNorm and RMSNorm over the last axis (forward, input and parameter gradients).

Rows are x[r, :] of a [rows, dim] view; statistics are float32 (float64 for f64 inputs):
  LayerNorm: mean = sum_d x / D, rstd = 1 / sqrt(sum_d (x - mean)^2 / D + eps),
             y = (x - mean) * rstd * weight + bias
  RMSNorm:   rstd = 1 / sqrt(sum_d x^2 / D + eps), y = x * rstd * weight
Backward (g = dy * weight, xhat = (x - mean) * rstd, mean = 0 for RMSNorm):
  dx = rstd * (g - mean_d(g) - xhat * mean_d(g * xhat))   (RMSNorm: no mean_d(g) term)
  dweight = sum_r dy * xhat, dbias = sum_r dy (written, not accumulated).
Parameter gradients are deterministic on the GPU: per-chunk partial sums go to the
workspace and a second kernel adds them in a fixed order (no atomics). D = 0 rows have
mean 0 and rstd 1/sqrt(eps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name, short_name
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import execute
from gpuplan.nvrtc import CudaModule, cdiv, launch
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


def _row_variant(dim: int) -> str:
    return "warp_row" if dim <= WARP_ROW_MAX_DIM else "block_row"


def _row_launch(variant: str, rows: int, dim: int) -> tuple[int, int]:
    """(grid, block) for the row-wise kernels."""
    if variant == "warp_row":
        return min(cdiv(rows, _WARPS_PER_BLOCK), _MAX_GRID), 32 * _WARPS_PER_BLOCK
    threads = min(512, max(128, cdiv(cdiv(dim, 8), 32) * 32))
    return min(rows, _MAX_GRID), threads


def _n_parts(rows: int) -> int:
    return max(1, min(_MAX_PARTS, cdiv(rows, 32)))


def _check_eps(op: str, eps: float) -> None:
    if not (math.isfinite(eps) and eps >= 0):
        raise InvalidProblem(describe(op, "eps", "a finite value >= 0", eps))


def _device_candidate(dtype: Any, dim: int, workspace: int = 0) -> Candidate:
    d = as_dtype(dtype)
    # Row sums are tree reductions whose shape follows the launch: deterministic for a
    # given launch, but not bit-stable.
    return Candidate(_row_variant(dim), BackendKind.NVRTC, True, False, short_name(d),
                     short_name(accumulator(d)), workspace)


def _stats(x: np.ndarray, rms: bool, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host statistics in the accumulator dtype of each row of x [R, D]: (mean, rstd, the
    centred rows x - mean as a fresh array); mean is zeros for RMSNorm."""
    acc = accumulator(x.dtype)
    dim = x.shape[1]
    inv = acc.type(1.0 / dim if dim else 0.0)
    if rms:
        mean = np.zeros(x.shape[0], acc)
        c = x.astype(acc)  # x - 0, exactly
    else:
        a = x.astype(acc, copy=False)
        mean = a.sum(axis=1)
        mean *= inv
        c = a - mean[:, None]
    sq = np.square(c)
    rstd = sq.sum(axis=1)
    rstd *= inv
    rstd += acc.type(eps)
    np.sqrt(rstd, out=rstd)
    np.divide(acc.type(1), rstd, out=rstd)
    return mean, rstd, c


# -- forward ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerNormDescriptor:
    rows: int
    dim: int
    eps: float = 1e-5
    has_weight: bool = True
    has_bias: bool = True
    dtype: Any = np.float32


@dataclass(frozen=True)
class LayerNormArgs:
    x: Any               # [rows, dim]
    weight: Any | None   # [dim] or None
    bias: Any | None     # [dim] or None
    y: Any               # [rows, dim]
    mean: Any            # [rows], float32 (float64 for f64)
    rstd: Any            # [rows], float32 (float64 for f64)


@dataclass(frozen=True)
class RMSNormDescriptor:
    rows: int
    dim: int
    eps: float = 1e-6
    has_weight: bool = True
    dtype: Any = np.float32


@dataclass(frozen=True)
class RMSNormArgs:
    x: Any               # [rows, dim]
    weight: Any | None   # [dim] or None
    y: Any               # [rows, dim]
    rstd: Any            # [rows], float32 (float64 for f64)


class _NormForwardPlan(Plan):
    category = "normalization"
    rms: bool = False

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        _check_eps(cls.op, desc.eps)

    @classmethod
    def _candidates(cls, desc: Any, on_device: bool) -> list[Candidate]:
        d = check_dtype(cls.op, "dtype", desc.dtype, FLOAT_DTYPES)
        return [_device_candidate(d, desc.dim)] if on_device else [host_candidate(d)]

    def _check_args(self, args: Any) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        check_operand(self.op, "x", args.x, (d.rows, d.dim), d.dtype)
        params = {"weight": (args.weight, d.has_weight)}
        if not self.rms:
            params["bias"] = (args.bias, d.has_bias)
        for name, (a, wanted) in params.items():
            if wanted:
                check_operand(self.op, name, a, (d.dim,), d.dtype)
            elif a is not None:
                raise InvalidProblem(describe(self.op, name, f"None (has_{name}=False)",
                                              "an array"))
        check_operand(self.op, "y", args.y, (d.rows, d.dim), d.dtype)
        outs = {"y": args.y, "rstd": args.rstd}
        if not self.rms:
            check_operand(self.op, "mean", args.mean, (d.rows,), acc)
            outs["mean"] = args.mean
        check_operand(self.op, "rstd", args.rstd, (d.rows,), acc)
        ins = {k: v for k, (v, _) in params.items()} | {"x": args.x}
        check_writable_distinct(self.op, outs, ins)
        for a, b in (("y", "rstd"), ("y", "mean"), ("mean", "rstd")):
            if a in outs and b in outs:
                check_writable_distinct(self.op, {a: outs[a]}, {b: outs[b]})

    def _is_empty(self) -> bool:
        return self.desc.rows == 0

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        mean, rstd, y = _stats(args.x, self.rms, self.desc.eps)
        acc = mean.dtype
        y *= rstd[:, None]
        if args.weight is not None:
            y *= args.weight.astype(acc, copy=False)
        if getattr(args, "bias", None) is not None:
            y += args.bias.astype(acc, copy=False)
        args.y[...] = y
        if not self.rms:
            args.mean[...] = mean
        args.rstd[...] = rstd

    def _run_warp_row(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        variant = self._cand.variant
        rms, warp = _BOOL[self.rms], _BOOL[variant == "warp_row"]
        fn = _MODULE.function(f"norm_forward<{cuda_name(d.dtype)}, {rms}, {warp}>",
                              stream.device_id)
        grid, block = _row_launch(variant, d.rows, d.dim)
        launch(stream, fn, grid, block,
               (args.x, args.weight, getattr(args, "bias", None), args.y,
                None if self.rms else args.mean, args.rstd, np.int64(d.rows), np.int64(d.dim),
                np.float64(d.eps)))

    _run_block_row = _run_warp_row


class LayerNormPlan(_NormForwardPlan):
    """LayerNorm forward: y, mean, rstd from x (see the module docstring for the math)."""

    op = "layer_norm"


class RMSNormPlan(_NormForwardPlan):
    """RMSNorm forward: y, rstd from x (see the module docstring for the math)."""

    op = "rms_norm"
    rms = True


# -- backward -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerNormBackwardDescriptor:
    rows: int
    dim: int
    has_weight: bool = True
    has_bias: bool = True
    dtype: Any = np.float32


@dataclass(frozen=True)
class LayerNormBackwardArgs:
    dy: Any                # [rows, dim]
    x: Any                 # [rows, dim] forward input
    weight: Any | None     # [dim] if has_weight
    mean: Any              # [rows] saved by the forward
    rstd: Any              # [rows] saved by the forward
    dx: Any                # [rows, dim] written
    dweight: Any | None    # [dim] written if has_weight
    dbias: Any | None      # [dim] written if has_bias


@dataclass(frozen=True)
class RMSNormBackwardDescriptor:
    rows: int
    dim: int
    has_weight: bool = True
    dtype: Any = np.float32


@dataclass(frozen=True)
class RMSNormBackwardArgs:
    dy: Any                # [rows, dim]
    x: Any                 # [rows, dim] forward input
    weight: Any | None     # [dim] if has_weight
    rstd: Any              # [rows] saved by the forward
    dx: Any                # [rows, dim] written
    dweight: Any | None    # [dim] written if has_weight


class _NormBackwardPlan(Plan):
    category = "normalization"
    rms: bool = False

    @classmethod
    def _candidates(cls, desc: Any, on_device: bool) -> list[Candidate]:
        d = check_dtype(cls.op, "dtype", desc.dtype, FLOAT_DTYPES)
        if not on_device:
            return [host_candidate(d)]
        n_bufs = int(desc.has_weight) + int(getattr(desc, "has_bias", False))
        ws = n_bufs * _n_parts(desc.rows) * desc.dim * accumulator(d).itemsize
        return [_device_candidate(d, desc.dim, ws)]

    def _has_bias(self) -> bool:
        return (not self.rms) and self.desc.has_bias

    def _check_args(self, args: Any) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        check_operand(self.op, "dy", args.dy, (d.rows, d.dim), d.dtype)
        check_operand(self.op, "x", args.x, (d.rows, d.dim), d.dtype)
        opt = [("weight", args.weight, d.has_weight), ("dweight", args.dweight, d.has_weight)]
        if not self.rms:
            opt.append(("dbias", args.dbias, d.has_bias))
        for name, a, wanted in opt:
            if wanted:
                check_operand(self.op, name, a, (d.dim,), d.dtype)
            elif a is not None:
                flag = "has_bias" if name == "dbias" else "has_weight"
                raise InvalidProblem(describe(self.op, name, f"None ({flag}=False)", "an array"))
        if not self.rms:
            check_operand(self.op, "mean", args.mean, (d.rows,), acc)
        check_operand(self.op, "rstd", args.rstd, (d.rows,), acc)
        check_operand(self.op, "dx", args.dx, (d.rows, d.dim), d.dtype)
        ins = {"dy": args.dy, "x": args.x, "weight": args.weight, "rstd": args.rstd,
               "mean": getattr(args, "mean", None)}
        outs = {"dx": args.dx, "dweight": args.dweight, "dbias": getattr(args, "dbias", None)}
        check_writable_distinct(self.op, outs, ins)
        check_writable_distinct(self.op, {"dx": args.dx},
                                {"dweight": args.dweight, "dbias": outs["dbias"]})
        check_writable_distinct(self.op, {"dweight": args.dweight}, {"dbias": outs["dbias"]})

    def _is_empty(self) -> bool:
        return self.desc.dim == 0

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        # dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight (mean(g) = 0
        # for RMSNorm); dweight = sum over rows of dy * xhat; dbias = sum over rows of dy.
        dy = args.dy.astype(acc, copy=False)
        rstd = args.rstd.astype(acc, copy=False)[:, None]
        x = args.x.astype(acc, copy=False)
        xhat = x * rstd if self.rms else (x - args.mean.astype(acc, copy=False)[:, None])
        if not self.rms:
            xhat *= rstd
        g = dy * args.weight.astype(acc, copy=False) if args.weight is not None else dy
        inv = acc.type(1.0 / d.dim)
        t = g * xhat
        proj = t.sum(axis=1, keepdims=True)
        proj *= inv
        if args.dweight is not None:
            if g is not dy:
                np.multiply(dy, xhat, out=t)
            args.dweight[...] = t.sum(axis=0)
        if self.rms:
            centred = g.copy() if g is dy else g
        else:
            mean_g = g.sum(axis=1, keepdims=True)
            mean_g *= inv
            centred = g - mean_g
        xhat *= proj
        centred -= xhat
        centred *= rstd
        args.dx[...] = centred
        if self._has_bias():
            args.dbias[...] = dy.sum(axis=0)

    def _run_device(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        t, rms = cuda_name(d.dtype), _BOOL[self.rms]
        variant = self._cand.variant
        mean = None if self.rms else args.mean
        if d.rows > 0:
            fn = _MODULE.function(
                f"norm_backward_dx<{t}, {rms}, {_BOOL[variant == 'warp_row']}>",
                stream.device_id)
            grid, block = _row_launch(variant, d.rows, d.dim)
            launch(stream, fn, grid, block,
                   (args.dy, args.x, args.weight, mean, args.rstd, args.dx, np.int64(d.rows),
                    np.int64(d.dim)))
        has_bias = self._has_bias()
        if args.dweight is None and not has_bias:
            return
        acc = accumulator(d.dtype)
        parts = _n_parts(d.rows)
        n = parts * d.dim
        part_w = ws.view(acc, n, 0) if args.dweight is not None else None
        b_off = 0 if part_w is None else n * acc.itemsize
        part_b = ws.view(acc, n, b_off) if has_bias else None
        fn = _MODULE.function(f"norm_param_grad_partial<{t}, {rms}>", stream.device_id)
        launch(stream, fn, (cdiv(d.dim, _PG_COLS), parts), (_PG_COLS, _PG_ROWS),
               (args.dy, args.x, mean, args.rstd, part_w, part_b, np.int64(d.rows),
                np.int64(d.dim), np.int64(max(1, cdiv(d.rows, parts)))))
        fn = _MODULE.function(f"norm_param_grad_final<{t}>", stream.device_id)
        launch(stream, fn, min(cdiv(d.dim, 256), _MAX_GRID), 256,
               (part_w, part_b, args.dweight, args.dbias if has_bias else None,
                np.int64(parts), np.int64(d.dim)))

    _run_warp_row = _run_device
    _run_block_row = _run_device


class LayerNormBackwardPlan(_NormBackwardPlan):
    """LayerNorm backward: dx, and dweight / dbias as the descriptor asks."""

    op = "layer_norm_backward"


class RMSNormBackwardPlan(_NormBackwardPlan):
    """RMSNorm backward: dx, and dweight when has_weight."""

    op = "rms_norm_backward"
    rms = True


# -- functional API ------------------------------------------------------------------------


def _rows_view(a: Any) -> Any:
    """A C-contiguous [rows, dim] view (or copy) of a [..., dim] array."""
    xp = backend.array_namespace(a)
    dim = int(a.shape[-1])
    rows = int(np.prod(a.shape[:-1], dtype=np.int64))
    return xp.ascontiguousarray(a).reshape(rows, dim)


def layer_norm(x: Any, weight: Any | None, bias: Any | None,
               eps: float = 1e-5) -> tuple[Any, Any, Any]:
    """LayerNorm over the last axis of x [..., D]: returns (y [..., D], mean [...], rstd [...])."""
    xp = backend.array_namespace(x)
    x2 = _rows_view(x)
    rows, dim = x2.shape
    acc = accumulator(x.dtype)
    y = xp.empty_like(x2)
    mean, rstd = xp.empty(rows, dtype=acc), xp.empty(rows, dtype=acc)
    desc = LayerNormDescriptor(rows, dim, float(eps), weight is not None, bias is not None,
                               as_dtype(x.dtype))
    execute(LayerNormPlan, desc, LayerNormArgs(x2, weight, bias, y, mean, rstd), like=x)
    lead = tuple(x.shape[:-1])
    return y.reshape(x.shape), mean.reshape(lead), rstd.reshape(lead)


def layer_norm_backward(dy: Any, x: Any, weight: Any | None, mean: Any,
                        rstd: Any) -> tuple[Any, Any | None, Any]:
    """(dx [..., D], dweight [D] or None, dbias [D]) of LayerNorm; dbias = sum of dy over rows
    is always returned (callers ignore it when the forward had no bias)."""
    xp = backend.array_namespace(x)
    x2, dy2 = _rows_view(x), _rows_view(dy)
    rows, dim = x2.shape
    dx = xp.empty_like(x2)
    dweight = None if weight is None else xp.empty(dim, dtype=x.dtype)
    dbias = xp.empty(dim, dtype=x.dtype)
    desc = LayerNormBackwardDescriptor(rows, dim, weight is not None, True, as_dtype(x.dtype))
    args = LayerNormBackwardArgs(dy2, x2, weight, mean.reshape(rows), rstd.reshape(rows), dx,
                                 dweight, dbias)
    execute(LayerNormBackwardPlan, desc, args, like=x)
    return dx.reshape(x.shape), dweight, dbias


def rms_norm(x: Any, weight: Any | None, eps: float = 1e-6) -> tuple[Any, Any]:
    """RMSNorm over the last axis of x [..., D]: returns (y [..., D], rstd [...])."""
    xp = backend.array_namespace(x)
    x2 = _rows_view(x)
    rows, dim = x2.shape
    y = xp.empty_like(x2)
    rstd = xp.empty(rows, dtype=accumulator(x.dtype))
    desc = RMSNormDescriptor(rows, dim, float(eps), weight is not None, as_dtype(x.dtype))
    execute(RMSNormPlan, desc, RMSNormArgs(x2, weight, y, rstd), like=x)
    return y.reshape(x.shape), rstd.reshape(tuple(x.shape[:-1]))


def rms_norm_backward(dy: Any, x: Any, weight: Any | None, rstd: Any) -> tuple[Any, Any | None]:
    """(dx [..., D], dweight [D] or None) of RMSNorm."""
    xp = backend.array_namespace(x)
    x2, dy2 = _rows_view(x), _rows_view(dy)
    rows, dim = x2.shape
    dx = xp.empty_like(x2)
    dweight = None if weight is None else xp.empty(dim, dtype=x.dtype)
    desc = RMSNormBackwardDescriptor(rows, dim, weight is not None, as_dtype(x.dtype))
    args = RMSNormBackwardArgs(dy2, x2, weight, rstd.reshape(rows), dx, dweight)
    execute(RMSNormBackwardPlan, desc, args, like=x)
    return dx.reshape(x.shape), dweight
