"""Softmax and log-softmax Functions over any axis (the plans work on the last axis)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from gpuplan import backend

if TYPE_CHECKING:
    from autograd.tensor import Tensor


def _to_last(x: Any, dim: int) -> Any:
    if dim == x.ndim - 1:
        return x
    return backend.ascontiguous(gp.array_namespace(x).moveaxis(x, dim, -1))


def _from_last(y: Any, dim: int) -> Any:
    if dim == y.ndim - 1:
        return y
    return backend.ascontiguous(gp.array_namespace(y).moveaxis(y, -1, dim))


class Softmax(Function):
    """y = softmax(scale * x) along `dim` (causal mask on [..., Lq, Lk] when dim is last).

    dx = scale * y * (dy - sum(dy * y, dim)).
    """

    @staticmethod
    def forward(ctx, x, dim, scale, causal):
        ctx.dim, ctx.scale, ctx.causal = dim, scale, causal
        last = dim == x.ndim - 1  # the common case: no moving of axes
        y = F.softmax(x if last else _to_last(x, dim), scale=scale, causal=causal)
        ctx.save_for_backward(y)
        return y if last else _from_last(y, dim)

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved
        dx = F.softmax_backward(y, _to_last(dy, ctx.dim), scale=ctx.scale, causal=ctx.causal)
        return _from_last(dx, ctx.dim)


class LogSoftmax(Function):
    """y = x - logsumexp(x) along `dim`; dx = dy - exp(y) * sum(dy, dim)."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        y = F.log_softmax(_to_last(x, dim))
        ctx.save_for_backward(y)
        return _from_last(y, dim)

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved
        return _from_last(F.log_softmax_backward(y, _to_last(dy, ctx.dim)), ctx.dim)


def _dim(dim: int, ndim: int, op: str) -> int:
    if not -ndim <= dim < ndim:
        raise ValueError(f"{op}: dim {dim} out of range for a {ndim}-d tensor")
    return dim % ndim


def softmax(x: Tensor, dim: int = -1, *, scale: float = 1.0, causal: bool = False) -> Tensor:
    ndim = x.ndim
    d = dim % ndim if -ndim <= dim < ndim else _dim(dim, ndim, "softmax")
    if causal and d != x.ndim - 1:
        raise ValueError("softmax: causal masking needs dim=-1 ([..., Lq, Lk] scores)")
    return Softmax.apply(x, dim=d, scale=float(scale), causal=bool(causal))


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    return LogSoftmax.apply(x, dim=_dim(dim, x.ndim, "log_softmax"))
