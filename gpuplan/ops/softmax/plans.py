"""Softmax and log-softmax over the last axis, with optional scale and causal mask.

Rows are x[r, :] of a [rows, dim] view; z = scale * x.
  softmax:     y = exp(z - max z) / sum_j exp(z_j - max z)
  log_softmax: y = z - max z - log(sum_j exp(z_j - max z))
Causal (x is [..., Lq, Lk], rows = batch * Lq, dim = Lk): row r is query i = r % Lq and
position j is masked when j > i + (Lk - Lq): softmax gives 0 there, log-softmax -inf.
(A row is fully masked only when Lq > Lk; it is then all 0 / all -inf.)
Backward, from the forward output y (sums over the unmasked positions; masked dx = 0):
  softmax:     dx = scale * y * (dy - sum_j dy_j * y_j)
  log_softmax: dx = scale * (dy - exp(y) * sum_j dy_j)
The four plans share one descriptor: scale and the causal mask are fixed per model (the
attention scale), so they are descriptor fields. Half types accumulate in float32. Host:
cache-sized blocks of rows over the host threads (gpuplan.host_pool); float32 and float64
inputs of up to SMALL elements in one call of a compiled kernel instead
(gpuplan.ops.softmax.host_kernels, when numba is there). GPU
SKUs: one row per warp (dim <= 1024) or one row per block, columns looped, so any row
length works (e.g. a 50257-word vocabulary).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpuplan import backend, host_jit
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name, short_name
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call, interned
from gpuplan.host_pool import for_blocks
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import DType, Extent, Flag, In, OpSpec, Out, Real
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
#: Host inputs of up to this many elements (float32, float64) run the compiled kernels of
#: gpuplan.ops.softmax.host_kernels when numba is there: one call instead of ~10 NumPy
#: calls. Larger ones keep the NumPy passes (a vectorized float32 exp; the kernels' float64
#: exp is a libm call per element).
SMALL = 4096
_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_HOST_KERNELS = "ops.softmax.host_kernels"
_WARPS_PER_BLOCK = 4
_MAX_GRID = 1 << 20

_FIELDS = (Extent("rows"), Extent("dim"), Real("scale", default=1.0),
           Flag("causal", default=False),
           Extent("q_len", default=0),  # Lq when causal (it divides rows); ignored otherwise
           DType("dtype", FLOAT_DTYPES, default=np.float32))
_ROWS = ("rows", "dim")
FORWARD = OpSpec("softmax", fields=_FIELDS, operands=(In("x", _ROWS), Out("y", _ROWS)))
BACKWARD = OpSpec("softmax_backward", fields=_FIELDS,
                  operands=(In("y", _ROWS), In("dy", _ROWS), Out("dx", _ROWS)))

SoftmaxDescriptor = FORWARD.descriptor(
    "SoftmaxDescriptor", "[rows, dim] rows of (log-)softmax(scale * x), forward and backward; "
    "causal: rows = batch * q_len, row r is query r % q_len over dim keys.")
#: forward and backward share the descriptor (same fields).
SoftmaxBackwardDescriptor = SoftmaxDescriptor
BACKWARD.descriptor_cls = SoftmaxDescriptor
SoftmaxArgs = FORWARD.args("SoftmaxArgs", "x, y [rows, dim].")
SoftmaxBackwardArgs = BACKWARD.args(
    "SoftmaxBackwardArgs", "y (the forward output), dy, dx [rows, dim].")


class _RowsPlan(Plan):
    """What the four plans share: descriptor rule, SKUs, launch shape, causal row limits."""

    category = "softmax"
    log = False
    _direction = "forward"

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        if desc.causal and (desc.q_len < 1 or desc.rows % desc.q_len):
            raise InvalidProblem(describe(cls.op, "q_len", f"q_len >= 1 dividing rows="
                                          f"{desc.rows} (causal)", desc.q_len))

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        variant = "warp_row" if desc.dim <= WARP_ROW_MAX_DIM else "block_row"
        # Tree reductions shaped by the launch: deterministic, not bit-stable.
        return [Candidate(variant, BackendKind.NVRTC, True, False, short_name(d),
                          short_name(accumulator(d)))]

    def _prepare(self) -> None:
        d = self.desc
        self._acc = accumulator(d.dtype)
        q_len = d.q_len if d.causal else 0
        #: the compiled kernels' arguments, for a host plan that takes them (else None).
        self._small = None
        if as_dtype(d.dtype) in _KERNEL_DTYPES and d.rows * d.dim <= SMALL:
            self._small = (float(d.scale), q_len, self.log)
        if self._cand.variant == "warp_row":
            self._grid = min(cdiv(d.rows, _WARPS_PER_BLOCK), _MAX_GRID)
            self._block = 32 * _WARPS_PER_BLOCK
        else:
            self._grid = min(d.rows, _MAX_GRID)
            self._block = min(1024, max(128, cdiv(cdiv(d.dim, 8), 32) * 32))
        self._kernel = (f"softmax_{self._direction}<{cuda_name(d.dtype)}, {_BOOL[self.log]}, "
                        f"{_BOOL[self._cand.variant == 'warp_row']}>")
        self._params = (np.int64(d.rows), np.int64(d.dim), np.float64(d.scale),
                        np.int64(q_len), np.int64(d.dim - q_len))
        # [q_len, dim] bool, True where masked (the same for every q_len rows), or None.
        self._mask = None
        if d.causal:
            valid = np.arange(d.q_len) + (d.dim - d.q_len) + 1
            self._mask = np.arange(d.dim)[None, :] >= valid[:, None]

    def _kernels(self) -> Any:
        """The compiled kernels when this plan's inputs are small enough and numba is there
        (gpuplan.host_jit), else None."""
        return None if self._small is None else host_jit.extra(_HOST_KERNELS)

    def _host_blocks(self, rows_fn: Any, *arrays: np.ndarray) -> None:
        """rows_fn(*row slices) over cache-sized blocks of rows (whole groups of q_len rows
        when causal), spread over the host threads (rows are independent: any split gives
        the same bits)."""
        d = self.desc
        for_blocks(d.rows, lambda lo, hi: rows_fn(*(a[lo:hi] for a in arrays)), d.dim,
                   d.q_len if d.causal else 1)

    def _launch(self, stream: Stream, arrays: tuple) -> None:
        launch(stream, _MODULE.function(self._kernel, stream.device_id), self._grid,
               self._block, arrays + self._params)


class SoftmaxPlan(_RowsPlan):
    """y = softmax(scale * x) over the last axis, optionally causal-masked."""

    op = "softmax"
    spec = FORWARD

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        k = self._kernels()
        if k is not None:
            k.softmax_forward(args.x, args.y, *self._small)
            return
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            self._host_blocks(self._forward_rows, args.x, args.y)

    def _forward_rows(self, x: np.ndarray, y: np.ndarray) -> None:
        """y = (log-)softmax of the rows x (whole causal groups of q_len rows)."""
        d, acc, masked = self.desc, self._acc, self._mask
        # A private copy (scaled on the way), updated in place below.
        z = x.astype(acc) if d.scale == 1 else np.multiply(x, acc.type(d.scale), dtype=acc)
        if masked is not None:  # z3 views z as [rows / q_len, q_len, dim]
            z3 = z.reshape(-1, d.q_len, d.dim)
            np.copyto(z3, -np.inf, where=masked)
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
        y[...] = z

    def _run_warp_row(self, stream: Stream, ws: Workspace, args: Any) -> None:
        self._launch(stream, (args.x, args.y))

    _run_block_row = _run_warp_row


class LogSoftmaxPlan(SoftmaxPlan):
    """y = log_softmax(scale * x) over the last axis (masked positions -inf)."""

    op = "log_softmax"
    log = True


class SoftmaxBackwardPlan(_RowsPlan):
    """dx = scale * y * (dy - sum(dy * y)) from the softmax output y."""

    op = "softmax_backward"
    spec = BACKWARD
    _direction = "backward"

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        k = self._kernels()
        if k is not None:
            k.softmax_backward(args.y, args.dy, args.dx, *self._small)
            return
        self._host_blocks(self._backward_rows, args.y, args.dy, args.dx)

    def _backward_rows(self, y: np.ndarray, dy: np.ndarray, dx_out: np.ndarray) -> None:
        d = self.desc
        acc = self._acc
        y, dy = y.astype(acc, copy=False), dy.astype(acc, copy=False)
        if self._mask is not None:  # masked positions take no part (and get dx = 0)
            dy = np.where(self._mask, acc.type(0), dy.reshape(-1, d.q_len, d.dim))
            dy = dy.reshape(y.shape)
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
        dx_out[...] = dx

    def _run_warp_row(self, stream: Stream, ws: Workspace, args: Any) -> None:
        self._launch(stream, (args.y, args.dy, args.dx))

    _run_block_row = _run_warp_row


class LogSoftmaxBackwardPlan(SoftmaxBackwardPlan):
    """dx = scale * (dy - exp(y) * sum(dy)) from the log-softmax output y."""

    op = "log_softmax_backward"
    log = True


# -- functional API ------------------------------------------------------------------------


def _rows(a: Any) -> Any:
    """`a` [..., dim] as a contiguous [rows, dim] array (a view when it can be)."""
    if not a.flags.c_contiguous:
        a = backend.ascontiguous(a)
    return a if a.ndim == 2 else a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


def _desc(plan_cls: type[Plan], a: Any, scale: float, causal: bool) -> Any:
    """The descriptor of `a` [..., dim] as rows (causal: a is [..., Lq, Lk])."""
    if causal and a.ndim < 2:
        raise InvalidProblem(describe(plan_cls.op, "x", "rank >= 2 ([..., Lq, Lk]) when causal",
                                      f"shape {tuple(a.shape)}"))
    return interned(SoftmaxDescriptor, math.prod(a.shape[:-1]), a.shape[-1], scale, causal,
                    a.shape[-2] if causal else 0, a.dtype)


def _forward(plan_cls: type[Plan], x: Any, scale: float, causal: bool) -> Any:
    if x.ndim == 2 and x.flags.c_contiguous:  # already [rows, dim]: the common case, in line
        return call(plan_cls, interned(SoftmaxDescriptor, *x.shape, scale, causal,
                                       x.shape[0] if causal else 0, x.dtype), like=x, x=x)
    y = call(plan_cls, _desc(plan_cls, x, scale, causal), like=x, x=_rows(x))
    return y.reshape(x.shape)


def _backward(plan_cls: type[Plan], y: Any, dy: Any, scale: float, causal: bool) -> Any:
    dx = call(plan_cls, _desc(plan_cls, y, scale, causal), like=y, y=_rows(y), dy=_rows(dy))
    return dx.reshape(y.shape)


def softmax(x: Any, *, scale: float = 1.0, causal: bool = False) -> Any:
    """softmax(scale * x) over the last axis; causal masks j > i + (Lk - Lq) of [..., Lq, Lk]."""
    return _forward(SoftmaxPlan, x, scale, causal)


def softmax_backward(y: Any, dy: Any, *, scale: float = 1.0, causal: bool = False) -> Any:
    """dx = scale * y * (dy - sum(dy * y, -1)) from the softmax output y (causal as in
    `softmax`: masked positions get dx = 0)."""
    return _backward(SoftmaxBackwardPlan, y, dy, scale, causal)


def log_softmax(x: Any) -> Any:
    """log_softmax(x) over the last axis."""
    return _forward(LogSoftmaxPlan, x, 1.0, False)


def log_softmax_backward(y: Any, dy: Any) -> Any:
    """dx = dy - exp(y) * sum(dy, -1) from the log-softmax output y."""
    return _backward(LogSoftmaxBackwardPlan, y, dy, 1.0, False)
