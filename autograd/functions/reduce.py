"""Reduction Functions with PyTorch's signatures: sum, mean, prod, max/min (values and indices
along a dim), argmax/argmin, topk, var/std; gradients broadcast or routed back to the input.

``dim``/``keepdim`` are torch's names; NumPy's ``axis``/``keepdims`` are accepted as aliases
(giving both is a TypeError). ``max``/``min`` with an int ``dim`` return torch's named tuple
(values, indices); with ``axis=`` (NumPy's name) or no dim they return the reduced tensor
(``amax``/``amin`` semantics, ties share the gradient).
"""

from __future__ import annotations

import math
from collections import namedtuple
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor_base import new_tensor
from gpuplan import backend
from gpuplan.dtypes import accumulator

if TYPE_CHECKING:
    from autograd.tensor import Tensor

#: torch.return_types look-alikes: attribute access (.values, .indices) and unpacking.
max_return = namedtuple("max", ["values", "indices"])
min_return = namedtuple("min", ["values", "indices"])
topk_return = namedtuple("topk", ["values", "indices"])
_RETURNS = {"max": max_return, "min": min_return}


def _rank1(ndim: int) -> int:
    """The dim range of a tensor: a 0-d one takes dim 0 and -1, like torch. (This module
    defines max/min/sum: no builtins here.)"""
    return ndim if ndim else 1


def _normalize_axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, int):
            raise TypeError(f"reduce: dim must be an int or a tuple of ints, given {a!r}")
        if not -_rank1(ndim) <= a < _rank1(ndim):
            raise ValueError(f"reduce: dim {a} out of range for a {ndim}-d tensor")
    return tuple(sorted({a % ndim for a in axes})) if ndim else ()


def _pick(op: str, dim: Any, keepdim: Any, axis: Any, keepdims: Any) -> tuple[Any, bool]:
    """(dim, keepdim) from torch's names or NumPy's aliases; both given is a TypeError."""
    if axis is not None:
        if dim is not None:
            raise TypeError(f"{op}(): got both 'dim' and its alias 'axis'")
        dim = axis
    if keepdims is not None:
        if keepdim is not None:
            raise TypeError(f"{op}(): got both 'keepdim' and its alias 'keepdims'")
        keepdim = keepdims
    return dim, bool(keepdim)


def _one_dim(op: str, dim: Any, ndim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{op}(): dim must be an int, given {dim!r}")
    if not -_rank1(ndim) <= dim < _rank1(ndim):
        raise ValueError(f"{op}(): dim {dim} out of range for a {ndim}-d tensor")
    return dim % _rank1(ndim)


def _kept_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _expand(dy: Any, shape: tuple[int, ...], axes: tuple[int, ...]) -> Any:
    """dy (reduced, kept or not) broadcast back to `shape`, contiguous."""
    kept = dy.reshape(_kept_shape(shape, axes))
    return backend.ascontiguous(gp.array_namespace(dy).broadcast_to(kept, shape))


def _route(dy: Any, indices: Any, shape: tuple[int, ...], dim: int) -> Any:
    """dx of shape `shape`: dy scattered to `indices` along dim (both with dim kept)."""
    zeros = gp.array_namespace(dy).zeros(shape, dtype=dy.dtype)
    return F.scatter_add(zeros, dim, indices, dy)


class Reduce(Function):
    """y = sum | mean | max | min | prod of x over `axes` (a normalized tuple).

    sum: dx = dy broadcast; mean: dx = dy / count broadcast; max/min: dy is shared equally by
    the elements equal to the result (PyTorch amax semantics for ties); prod (one dim or
    all): dy times the product of the other elements (gp prod_backward, exact for zeros).
    """

    @staticmethod
    def forward(ctx, x, name, axes, keepdims):
        ctx.name, ctx.axes, ctx.shape = name, axes, x.shape
        y = F.reduce(name, x, axes=axes, keepdims=keepdims)
        if name in ("max", "min", "prod"):
            ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, dy):
        shape, axes = ctx.shape, ctx.axes
        if ctx.name == "sum":
            return _expand(dy, shape, axes)
        if ctx.name == "mean":
            count = math.prod(shape[a] for a in axes)
            return _expand(F.unary("scale", dy, alpha=1.0 / (count or 1)), shape, axes)
        x, y = ctx.saved
        if ctx.name == "prod":
            dim = None if len(axes) == len(shape) else axes[0]
            return F.prod_backward(x, dy, dim)
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


class Select(Function):
    """(values, indices) of the max or min along one dim (indices int64, not differentiable;
    NaN wins, ties go to the lowest index). dx: dy routed to the selected index."""

    @staticmethod
    def forward(ctx, x, name, dim, keepdim):
        values, indices = F.arg_select(name, x, dim, True)
        ctx.shape, ctx.dim = x.shape, dim
        ctx.save_for_backward(indices)
        if not keepdim:
            values, indices = values.squeeze(dim), indices.squeeze(dim)
        ctx.mark_non_differentiable(indices)
        return values, indices

    @staticmethod
    def backward(ctx, dy, _):
        (indices,) = ctx.saved
        return _route(dy.reshape(indices.shape), indices, ctx.shape, ctx.dim)


def _max_min(name: str, x: Tensor, dim: Any, keepdim: Any, axis: Any, keepdims: Any) -> Any:
    numpy_style = axis is not None
    dim, keepdim = _pick(name, dim, keepdim, axis, keepdims)
    if dim is None or numpy_style:
        return reduce(name, x, dim, keepdim)
    d = _one_dim(name, dim, x.ndim)
    if x.ndim == 0:
        return _RETURNS[name](reduce(name, x, None, False), _arg(name, x, None, None, None,
                                                                 None))
    return _RETURNS[name](*Select.apply(x, name=name, dim=d, keepdim=keepdim))


def sum(x: Tensor, dim: Any = None, keepdim: bool | None = None, *,  # noqa: A001
        axis: Any = None, keepdims: bool | None = None) -> Tensor:
    """Sum over `dim` (int, tuple or None: all), as torch.sum."""
    return reduce("sum", x, *_pick("sum", dim, keepdim, axis, keepdims))


def mean(x: Tensor, dim: Any = None, keepdim: bool | None = None, *,
         axis: Any = None, keepdims: bool | None = None) -> Tensor:
    """Mean over `dim` (int, tuple or None: all), as torch.mean."""
    return reduce("mean", x, *_pick("mean", dim, keepdim, axis, keepdims))


def prod(x: Tensor, dim: int | None = None, keepdim: bool | None = None, *,
         axis: int | None = None, keepdims: bool | None = None) -> Tensor:
    """Product over one dim or all elements (torch.prod); gradient exact at zeros."""
    dim, keepdim = _pick("prod", dim, keepdim, axis, keepdims)
    if dim is not None:
        dim = _one_dim("prod", dim, x.ndim)
    return reduce("prod", x, dim, keepdim)


def max(x: Tensor, dim: int | None = None, keepdim: bool | None = None, *,  # noqa: A001
        axis: Any = None, keepdims: bool | None = None) -> Any:
    """torch.max: no dim, the max as a 0-d tensor; an int dim, (values, indices)."""
    return _max_min("max", x, dim, keepdim, axis, keepdims)


def min(x: Tensor, dim: int | None = None, keepdim: bool | None = None, *,  # noqa: A001
        axis: Any = None, keepdims: bool | None = None) -> Any:
    """torch.min: no dim, the min as a 0-d tensor; an int dim, (values, indices)."""
    return _max_min("min", x, dim, keepdim, axis, keepdims)


def amax(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return reduce("max", x, dim, keepdim)


def amin(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return reduce("min", x, dim, keepdim)


def _arg(name: str, x: Tensor, dim: Any, keepdim: Any, axis: Any, keepdims: Any) -> Tensor:
    dim, keepdim = _pick(f"arg{name}", dim, keepdim, axis, keepdims)
    if dim is not None:
        dim = _one_dim(f"arg{name}", dim, x.ndim) if x.ndim else None
    _, indices = F.arg_select(name, x.data, dim, keepdim)
    return new_tensor(indices)


def argmax(x: Tensor, dim: int | None = None, keepdim: bool | None = None, *,
           axis: int | None = None, keepdims: bool | None = None) -> Tensor:
    """int64 index of the max along dim (None: into the flattened tensor); the first of
    equal maxima, the first NaN when there is one (torch's rule)."""
    return _arg("max", x, dim, keepdim, axis, keepdims)


def argmin(x: Tensor, dim: int | None = None, keepdim: bool | None = None, *,
           axis: int | None = None, keepdims: bool | None = None) -> Tensor:
    """int64 index of the min along dim (None: flattened); first of ties, NaN wins."""
    return _arg("min", x, dim, keepdim, axis, keepdims)


class Topk(Function):
    """(values, indices) of the k largest (smallest) along dim, sorted; dx: dy scattered to
    the indices (gp scatter_add into zeros)."""

    @staticmethod
    def forward(ctx, x, k, dim, largest):
        values, indices = F.topk(x, k, dim, largest)
        ctx.shape, ctx.dim = x.shape, dim
        ctx.save_for_backward(indices)
        ctx.mark_non_differentiable(indices)
        return values, indices

    @staticmethod
    def backward(ctx, dy, _):
        (indices,) = ctx.saved
        return _route(dy, indices, ctx.shape, ctx.dim)


def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True  # noqa: A002
         ) -> Any:
    """torch.topk: (values, indices) of the k largest (largest=False: smallest) entries along
    dim, always in sorted order (allowed for sorted=False too); ties by ascending index."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"topk(): k must be a non-negative int, given {k!r}")
    d = _one_dim("topk", dim, x.ndim)
    n = x.shape[d] if x.ndim else 1
    if k > n:
        raise ValueError(f"topk(): k ({k}) out of range for dim {dim} of size {n}")
    return topk_return(*Topk.apply(x, k=k, dim=d, largest=bool(largest)))


class Variance(Function):
    """var (std) over axes with `correction`; two-pass plan forward. With c = 1/(n - corr):
    var: dx = 2c (x - mean) dy; std: dx = c (x - mean) dy / std."""

    @staticmethod
    def forward(ctx, x, axes, keepdim, correction, std):
        y = F.variance(x, axes, True, correction, std)
        ctx.axes, ctx.correction, ctx.std = axes, correction, std
        ctx.save_for_backward(x, y)
        return y if keepdim else y.reshape(tuple(e for i, e in enumerate(x.shape)
                                                 if i not in axes))

    @staticmethod
    def backward(ctx, dy):
        x, y = ctx.saved
        n = math.prod(x.shape[a] for a in ctx.axes)
        dof = n - ctx.correction
        if dof <= 0 or x.size == 0:  # torch's gradient is NaN here as well
            return gp.array_namespace(x).full(x.shape, float("nan"), dtype=x.dtype)
        centered = F.binary("sub", x, F.reduce("mean", x, axes=ctx.axes, keepdims=True))
        g = dy.reshape(y.shape)
        if ctx.std:
            g = F.binary("div", g, y)
        return F.binary("mul", F.unary("scale", centered, alpha=(1.0 if ctx.std else 2.0) / dof),
                        g)


def _variance(op: str, x: Tensor, dim: Any, unbiased: Any, keepdim: Any, correction: Any,
              axis: Any, keepdims: Any) -> Tensor:
    dim, keepdim = _pick(op, dim, keepdim, axis, keepdims)
    if unbiased is not None:
        if correction is not None:
            raise TypeError(f"{op}(): got both 'correction' and its alias 'unbiased'")
        correction = 1 if unbiased else 0
    correction = 1 if correction is None else correction
    if correction < 0:
        raise ValueError(f"{op}(): correction must be >= 0, given {correction}")
    return Variance.apply(x, axes=_normalize_axes(dim, x.ndim), keepdim=keepdim,
                          correction=float(correction), std=op == "std")


def var(x: Tensor, dim: Any = None, unbiased: Any = None, keepdim: bool | None = None, *,
        correction: float | None = None, axis: Any = None, keepdims: bool | None = None
        ) -> Tensor:
    """torch.var: sum((x - mean)^2) / max(0, n - correction), correction 1 by default
    (``unbiased=False``: 0)."""
    return _variance("var", x, dim, unbiased, keepdim, correction, axis, keepdims)


def std(x: Tensor, dim: Any = None, unbiased: Any = None, keepdim: bool | None = None, *,
        correction: float | None = None, axis: Any = None, keepdims: bool | None = None
        ) -> Tensor:
    """torch.std: the square root of var (same arguments)."""
    return _variance("std", x, dim, unbiased, keepdim, correction, axis, keepdims)
