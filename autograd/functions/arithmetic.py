"""Arithmetic Functions: add, sub, mul, div, pow, maximum, minimum with broadcasting,
scale/neg by a constant, and the comparisons (bool results, no gradient)."""

from __future__ import annotations

from typing import Any

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor import Tensor


class Binary(Function):
    """c = a <op> b (NumPy broadcasting); grads are summed back to a.shape and b.shape.
    pow, maximum and minimum follow torch (see gpuplan.ops.binary_table)."""

    @staticmethod
    def forward(ctx, a, b, name):
        ctx.name = name
        ctx.save_for_backward(a, b)
        return F.binary(name, a, b)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved
        da, db = F.binary_backward(ctx.name, a, b, dc)
        need_a, need_b = ctx.needs_input_grad
        return (da if need_a else None), (db if need_b else None)


class Scale(Function):
    """y = alpha * x (alpha a Python float)."""

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return F.unary("scale", x, alpha=alpha)

    @staticmethod
    def backward(ctx, dy):
        return F.unary("scale", dy, alpha=ctx.alpha)


class Neg(Function):
    @staticmethod
    def forward(ctx, x):
        return F.unary("neg", x)

    @staticmethod
    def backward(ctx, dy):
        return F.unary("neg", dy)


def _is_scalar(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _constant(value: Any, like: Tensor) -> Any:
    """A non-Tensor operand as an array of `like`'s dtype on its device."""
    if _is_scalar(value):
        return gp.full((), float(value), like.dtype, like.device)
    return gp.asarray(value, dtype=like.dtype, device=like.device)


def _binary(name: str, a: Any, b: Any) -> Tensor:
    if not isinstance(a, Tensor):
        a = _constant(a, b)
    elif not isinstance(b, Tensor):
        b = _constant(b, a)
    return Binary.apply(a, b, name=name)


def add(a: Any, b: Any) -> Tensor:
    return _binary("add", a, b)


def sub(a: Any, b: Any) -> Tensor:
    return _binary("sub", a, b)


def mul(a: Any, b: Any) -> Tensor:
    if isinstance(a, Tensor) and _is_scalar(b):
        return Scale.apply(a, alpha=float(b))
    if isinstance(b, Tensor) and _is_scalar(a):
        return Scale.apply(b, alpha=float(a))
    return _binary("mul", a, b)


def div(a: Any, b: Any) -> Tensor:
    if isinstance(a, Tensor) and _is_scalar(b):
        return Scale.apply(a, alpha=1.0 / float(b))
    return _binary("div", a, b)


def neg(x: Tensor) -> Tensor:
    return Neg.apply(x)


def pow(a: Any, b: Any) -> Tensor:  # noqa: A001 - torch.pow
    """a ** b: tensor ** tensor, tensor ** scalar or scalar ** tensor (torch semantics:
    0 ** 0 = 1, a negative base with a non-integer exponent is NaN; the gradient of a is 0
    where b == 0, of b where a == 0 and b >= 0)."""
    return _binary("pow", a, b)


def maximum(input: Tensor, other: Any) -> Tensor:  # noqa: A002
    """Elementwise max, NaN propagating; on a tie each side gets half the gradient."""
    return _binary("maximum", input, other)


def minimum(input: Tensor, other: Any) -> Tensor:  # noqa: A002
    """Elementwise min, NaN propagating; on a tie each side gets half the gradient."""
    return _binary("minimum", input, other)


COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")


def compare(name: str, a: Any, b: Any) -> Tensor:
    """a <name> b elementwise with broadcasting: a bool Tensor outside the tape (comparisons
    have no gradient, as in torch). A Python number compares in the tensor's dtype."""
    if name not in COMPARISONS:
        raise ValueError(f"compare: unknown comparison {name!r}; expected one of "
                         f"{COMPARISONS}")
    if not isinstance(a, Tensor):
        a = Tensor(_constant(a, b))
    elif not isinstance(b, Tensor):
        b = Tensor(_constant(b, a))
    if a.dtype != b.dtype:
        raise TypeError(f"{name}(): the operands must have one dtype, given {a.dtype} and "
                        f"{b.dtype}")
    return Tensor(F.binary(name, a.data, b.data))
