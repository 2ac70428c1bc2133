"""Softmax and log-softmax over the last axis, with optional scale and causal mask.

Rows are x[r, :] of a [rows, dim] view; z = scale * x.
  softmax:     y = exp(z - max z) / sum_j exp(z_j - max z)
  log_softmax: y = z - max z - log(sum_j exp(z_j - max z))
Causal (x is [..., Lq, Lk], rows = batch * Lq, dim = Lk): row r is query i = r % Lq and
position j is masked when j > i + (Lk - Lq): softmax gives 0 there, log-softmax -inf.
(A row is fully masked only when Lq > Lk; it is then all 0 / all -inf.)
Backward, from the forward output y:
  softmax:     dx = scale * y * (dy - sum_j dy_j * y_j)   (masked y = 0 gives dx = 0)
  log_softmax: dx = scale * (dy - exp(y) * sum_j dy_j)
Half types accumulate in float32. GPU SKUs: one row per warp (dim <= 1024) or one row per
block, columns looped, so any row length works (e.g. a 50257-word vocabulary).
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
    "SoftmaxDescriptor", "SoftmaxArgs", "SoftmaxPlan", "LogSoftmaxPlan",
    "SoftmaxBackwardDescriptor", "SoftmaxBackwardArgs", "SoftmaxBackwardPlan",
    "LogSoftmaxBackwardPlan",
]
__functional__ = ["softmax", "softmax_backward", "log_softmax", "log_softmax_backward"]

_BOOL = ("false", "true")
_MODULE = CudaModule(
    __file__,
    "softmax.cu",
    [f"softmax_{k}<{cuda_name(t)}, {lg}, {w}>" for k in ("forward", "backward")
     for t in FLOAT_DTYPES for lg in _BOOL for w in _BOOL],
)

#: Rows up to this length go one per warp; longer rows get a whole block.
WARP_ROW_MAX_DIM = 1024
_WARPS_PER_BLOCK = 4
_MAX_GRID = 1 << 20


def _row_launch(variant: str, rows: int, dim: int) -> tuple[int, int]:
    if variant == "warp_row":
        return min(cdiv(rows, _WARPS_PER_BLOCK), _MAX_GRID), 32 * _WARPS_PER_BLOCK
    threads = min(1024, max(128, cdiv(cdiv(dim, 8), 32) * 32))
    return min(rows, _MAX_GRID), threads


def _candidates_for(op: str, desc: Any, on_device: bool) -> list[Candidate]:
    d = check_dtype(op, "dtype", desc.dtype, FLOAT_DTYPES)
    if not on_device:
        return [host_candidate(d)]
    variant = "warp_row" if desc.dim <= WARP_ROW_MAX_DIM else "block_row"
    # Tree reductions shaped by the launch: deterministic, not bit-stable.
    return [Candidate(variant, BackendKind.NVRTC, True, False, short_name(d),
                      short_name(accumulator(d)))]


def _check_scale(op: str, scale: float) -> None:
    if not math.isfinite(scale):
        raise InvalidProblem(describe(op, "scale", "a finite number", scale))


@dataclass(frozen=True)
class SoftmaxDescriptor:
    rows: int
    dim: int
    scale: float = 1.0
    causal: bool = False
    q_len: int = 0        # Lq when causal (rows must be a multiple of it); ignored otherwise
    dtype: Any = np.float32


@dataclass(frozen=True)
class SoftmaxArgs:
    x: Any  # [rows, dim]
    y: Any  # [rows, dim]


class SoftmaxPlan(Plan):
    """y = softmax(scale * x) over the last axis, optionally causal-masked."""

    op = "softmax"
    category = "softmax"
    log = False

    @classmethod
    def _check_descriptor(cls, desc: SoftmaxDescriptor) -> None:
        super()._check_descriptor(desc)
        _check_scale(cls.op, desc.scale)
        if desc.causal and (desc.q_len < 1 or desc.rows % desc.q_len):
            raise InvalidProblem(describe(cls.op, "q_len", f"q_len >= 1 dividing rows={desc.rows}"
                                          " (causal)", desc.q_len))

    @classmethod
    def _candidates(cls, desc: SoftmaxDescriptor, on_device: bool) -> list[Candidate]:
        return _candidates_for(cls.op, desc, on_device)

    def _check_args(self, args: SoftmaxArgs) -> None:
        d = self.desc
        check_operand(self.op, "x", args.x, (d.rows, d.dim), d.dtype)
        check_operand(self.op, "y", args.y, (d.rows, d.dim), d.dtype)
        check_writable_distinct(self.op, {"y": args.y}, {"x": args.x})

    def _is_empty(self) -> bool:
        return self.desc.rows == 0 or self.desc.dim == 0

    def _valid_counts(self) -> np.ndarray | None:
        """Unmasked columns per row (causal), or None."""
        d = self.desc
        if not d.causal:
            return None
        i = np.arange(d.rows, dtype=np.int64) % d.q_len
        return np.clip(i + (d.dim - d.q_len) + 1, 0, d.dim)

    def _host_mask(self) -> np.ndarray | None:
        """[q_len, dim] bool, True where causally masked (the same for every q_len rows;
        built once per plan), or None."""
        d = self.desc
        mask = getattr(self, "_mask", None)
        if mask is None and d.causal:
            valid = self._valid_counts()[:d.q_len]
            mask = self._mask = np.arange(d.dim)[None, :] >= valid[:, None]
        return mask

    def _run_numpy(self, stream: Stream, ws: Workspace, args: SoftmaxArgs) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        # A private copy (scaled on the way), updated in place below.
        z = args.x.astype(acc) if d.scale == 1 else np.multiply(args.x, acc.type(d.scale),
                                                                 dtype=acc)
        masked = self._host_mask()
        if masked is not None:  # z3 views z as [rows / q_len, q_len, dim]
            z3 = z.reshape(-1, d.q_len, d.dim)
            np.copyto(z3, -np.inf, where=masked)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            m = z.max(axis=1, keepdims=True)
            m[np.isneginf(m)] = 0  # fully masked rows
            z -= m
            if self.log:
                s = np.exp(z).sum(axis=1, keepdims=True)
                z -= np.log(s)
            else:
                np.exp(z, out=z)
                s = z.sum(axis=1, keepdims=True)
                z /= s
        # With every row max finite and every sum > 0, masked entries already hold exactly
        # exp(-inf) / s = 0 (log: -inf); only rows of NaN or all -inf need the mask again.
        if masked is not None and not np.all(s > 0):
            np.copyto(z3, -np.inf if self.log else 0, where=masked)
        args.y[...] = z

    def _run_warp_row(self, stream: Stream, ws: Workspace, args: SoftmaxArgs) -> None:
        d = self.desc
        variant = self._cand.variant
        fn = _MODULE.function(
            f"softmax_forward<{cuda_name(d.dtype)}, {_BOOL[self.log]}, "
            f"{_BOOL[variant == 'warp_row']}>", stream.device_id)
        grid, block = _row_launch(variant, d.rows, d.dim)
        q_len = d.q_len if d.causal else 0
        launch(stream, fn, grid, block,
               (args.x, args.y, np.int64(d.rows), np.int64(d.dim), np.float64(d.scale),
                np.int64(q_len), np.int64(d.dim - q_len)))

    _run_block_row = _run_warp_row


class LogSoftmaxPlan(SoftmaxPlan):
    """y = log_softmax(scale * x) over the last axis (masked positions -inf)."""

    op = "log_softmax"
    log = True


@dataclass(frozen=True)
class SoftmaxBackwardDescriptor:
    rows: int
    dim: int
    scale: float = 1.0
    dtype: Any = np.float32


@dataclass(frozen=True)
class SoftmaxBackwardArgs:
    y: Any   # [rows, dim] forward output
    dy: Any  # [rows, dim]
    dx: Any  # [rows, dim] written


class SoftmaxBackwardPlan(Plan):
    """dx = scale * y * (dy - sum(dy * y)) from the softmax output y."""

    op = "softmax_backward"
    category = "softmax"
    log = False

    @classmethod
    def _check_descriptor(cls, desc: SoftmaxBackwardDescriptor) -> None:
        super()._check_descriptor(desc)
        _check_scale(cls.op, desc.scale)

    @classmethod
    def _candidates(cls, desc: SoftmaxBackwardDescriptor, on_device: bool) -> list[Candidate]:
        return _candidates_for(cls.op, desc, on_device)

    def _check_args(self, args: SoftmaxBackwardArgs) -> None:
        d = self.desc
        for name in ("y", "dy", "dx"):
            check_operand(self.op, name, getattr(args, name), (d.rows, d.dim), d.dtype)
        check_writable_distinct(self.op, {"dx": args.dx}, {"y": args.y, "dy": args.dy})

    def _is_empty(self) -> bool:
        return self.desc.rows == 0 or self.desc.dim == 0

    def _run_numpy(self, stream: Stream, ws: Workspace, args: SoftmaxBackwardArgs) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        y, dy = args.y.astype(acc, copy=False), args.dy.astype(acc, copy=False)
        if self.log:
            dx = np.exp(y)
            dx *= dy.sum(axis=1, keepdims=True)
            np.subtract(dy, dx, out=dx)
        else:
            dx = dy * y
            s = dx.sum(axis=1, keepdims=True)
            np.subtract(dy, s, out=dx)
            dx *= y
        if d.scale != 1:
            dx *= acc.type(d.scale)
        args.dx[...] = dx

    def _run_warp_row(self, stream: Stream, ws: Workspace, args: SoftmaxBackwardArgs) -> None:
        d = self.desc
        variant = self._cand.variant
        fn = _MODULE.function(
            f"softmax_backward<{cuda_name(d.dtype)}, {_BOOL[self.log]}, "
            f"{_BOOL[variant == 'warp_row']}>", stream.device_id)
        grid, block = _row_launch(variant, d.rows, d.dim)
        launch(stream, fn, grid, block,
               (args.y, args.dy, args.dx, np.int64(d.rows), np.int64(d.dim),
                np.float64(d.scale)))

    _run_block_row = _run_warp_row


class LogSoftmaxBackwardPlan(SoftmaxBackwardPlan):
    """dx = scale * (dy - exp(y) * sum(dy)) from the log-softmax output y."""

    op = "log_softmax_backward"
    log = True


# -- functional API ------------------------------------------------------------------------


def _rows(a: Any) -> Any:
    xp = backend.array_namespace(a)
    dim = int(a.shape[-1])
    return xp.ascontiguousarray(a).reshape(int(np.prod(a.shape[:-1], dtype=np.int64)), dim)


def _forward(plan_cls: type[Plan], x: Any, scale: float, causal: bool) -> Any:
    if causal and x.ndim < 2:
        raise InvalidProblem(describe(plan_cls.op, "x", "rank >= 2 ([..., Lq, Lk]) when causal",
                                      f"shape {tuple(x.shape)}"))
    x2 = _rows(x)
    y = backend.array_namespace(x).empty_like(x2)
    q_len = int(x.shape[-2]) if causal else 0
    desc = SoftmaxDescriptor(x2.shape[0], x2.shape[1], float(scale), bool(causal), q_len,
                             as_dtype(x.dtype))
    execute(plan_cls, desc, SoftmaxArgs(x2, y), like=x)
    return y.reshape(x.shape)


def _backward(plan_cls: type[Plan], y: Any, dy: Any, scale: float) -> Any:
    y2, dy2 = _rows(y), _rows(dy)
    dx = backend.array_namespace(y).empty_like(y2)
    desc = SoftmaxBackwardDescriptor(y2.shape[0], y2.shape[1], float(scale), as_dtype(y.dtype))
    execute(plan_cls, desc, SoftmaxBackwardArgs(y2, dy2, dx), like=y)
    return dx.reshape(y.shape)


def softmax(x: Any, *, scale: float = 1.0, causal: bool = False) -> Any:
    """softmax(scale * x) over the last axis; causal masks j > i + (Lk - Lq) of [..., Lq, Lk]."""
    return _forward(SoftmaxPlan, x, scale, causal)


def softmax_backward(y: Any, dy: Any, *, scale: float = 1.0) -> Any:
    """dx = scale * y * (dy - sum(dy * y, -1)) from the softmax output y."""
    return _backward(SoftmaxBackwardPlan, y, dy, scale)


def log_softmax(x: Any) -> Any:
    """log_softmax(x) over the last axis."""
    return _forward(LogSoftmaxPlan, x, 1.0, False)


def log_softmax_backward(y: Any, dy: Any) -> Any:
    """dx = dy - exp(y) * sum(dy, -1) from the log-softmax output y."""
    return _backward(LogSoftmaxBackwardPlan, y, dy, 1.0)
