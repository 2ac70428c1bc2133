"""Reduction Functions: sum, mean, max over axes (gradient broadcast back to the input)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor import Tensor
from gpuplan import backend
from gpuplan.dtypes import accumulator


def _normalize_axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"reduce: axis {a} out of range for a {ndim}-d tensor")
    return tuple(sorted({a % ndim for a in axes}))


def _kept_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _expand(dy: Any, shape: tuple[int, ...], axes: tuple[int, ...]) -> Any:
    """dy (reduced, kept or not) broadcast back to `shape`, contiguous."""
    kept = dy.reshape(_kept_shape(shape, axes))
    return backend.ascontiguous(gp.array_namespace(dy).broadcast_to(kept, shape))


class Reduce(Function):
    """y = sum | mean | max of x over `axes` (a normalized tuple).

    sum: dx = dy broadcast; mean: dx = dy / count broadcast; max: dy is shared equally by
    the elements equal to the maximum (PyTorch amax semantics for ties).
    """

    @staticmethod
    def forward(ctx, x, name, axes, keepdims):
        ctx.name, ctx.axes, ctx.shape = name, axes, x.shape
        y = F.reduce(name, x, axes=axes, keepdims=keepdims)
        if name == "max":
            ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, dy):
        shape, axes = ctx.shape, ctx.axes
        if ctx.name == "sum":
            return _expand(dy, shape, axes)
        if ctx.name == "mean":
            count = 1
            for a in axes:
                count *= shape[a]
            return _expand(F.unary("scale", dy, alpha=1.0 / (count or 1)), shape, axes)
        x, y = ctx.saved
        # Compare in the accumulator dtype (f32 for halves: portable comparisons), then
        # bring the 0/1 mask back to x's dtype through the cast plan.
        acc = accumulator(x.dtype)
        kept = y.reshape(_kept_shape(shape, axes))
        if acc != x.dtype:
            x, kept = F.cast(x, acc), F.cast(kept, acc)
        mask = F.cast((x == kept).astype(acc), dy.dtype)
        ties = F.reduce("sum", mask, axes=axes, keepdims=True)
        share = F.binary("div", dy.reshape(_kept_shape(shape, axes)), ties)
        return F.binary("mul", mask, share)


def reduce(name: str, x: Tensor, axis: int | Sequence[int] | None = None,
           keepdims: bool = False) -> Tensor:
    return Reduce.apply(x, name=name, axes=_normalize_axes(axis, x.ndim),
                        keepdims=bool(keepdims))


def sum(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return reduce("sum", x, axis, keepdims)


def mean(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    return reduce("mean", x, axis, keepdims)


def max(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return reduce("max", x, axis, keepdims)
