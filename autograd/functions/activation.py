"""Elementwise unary Functions via the activation plans: relu, gelu, gelu_tanh, silu, tanh,
exp, log, sqrt, rsqrt, sigmoid, abs, and clamp (optional min / max, numbers or broadcastable
tensors, as torch.clamp)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from autograd.functions.arithmetic import convert_operand, result_type
from autograd.functions.shape import sum_to_shape
from autograd.tensor_base import TensorBase

if TYPE_CHECKING:
    from autograd.tensor import Tensor

NAMES = ("relu", "gelu", "gelu_tanh", "silu", "tanh", "exp", "log", "sqrt", "rsqrt",
         "sigmoid", "abs")


class Unary(Function):
    """y = f(x) for f in NAMES; backward dx = f'(x) * dy (gp unary_backward, x saved)."""

    @staticmethod
    def forward(ctx, x, name):
        ctx.name = name
        ctx.save_for_backward(x)
        return F.unary(name, x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved
        return F.unary_backward(ctx.name, x, dy)


class Clamp(Function):
    """y = min(max(x, lo), hi) (NaN stays NaN; lo > hi gives hi); dx = dy where
    lo <= x <= hi, else 0. A missing bound is None (unbounded on that side)."""

    @staticmethod
    def forward(ctx, x, lo, hi):
        ctx.bounds = (lo, hi)
        ctx.save_for_backward(x)
        return F.unary("clamp", x, alpha=lo, beta=hi)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved
        lo, hi = ctx.bounds
        return F.unary_backward("clamp", x, dy, alpha=lo, beta=hi)


class ClampTensor(Function):
    """y = minimum(maximum(x, lo), hi) with broadcastable tensor bounds (lo or hi None:
    unbounded), through the binary plans; NaN in x or in a bound gives NaN. Gradients are
    torch's clamp.Tensor ones, each summed back to its operand's shape:
    dx = dy where lo <= x <= hi; dlo = dy where x < lo < hi; dhi = dy where x > hi or
    hi < lo (where lo > hi every element is hi)."""

    @staticmethod
    def forward(ctx, x, lo, hi):
        ctx.save_for_backward(x, lo, hi)
        y = x if lo is None else F.binary("maximum", x, lo)
        return y if hi is None else F.binary("minimum", y, hi)

    @staticmethod
    def backward(ctx, dy):
        x, lo, hi = ctx.saved
        zero = gp.full((), 0, dy.dtype, gp.device_of(dy))

        def routed(mask: Any, shape: tuple) -> Any:
            return sum_to_shape(F.where(mask, dy, zero), tuple(shape))

        need_x, need_lo, need_hi = ctx.needs_input_grad
        dx = dlo = dhi = None
        if need_x:
            m = None if lo is None else F.binary("ge", x, lo)
            if hi is not None:
                le = F.binary("le", x, hi)
                m = le if m is None else F.binary("bitwise_and", m, le)
            dx = routed(m, x.shape)
        if need_lo:
            m = F.binary("lt", x, lo)
            if hi is not None:
                m = F.binary("bitwise_and", m, F.binary("lt", lo, hi))
            dlo = routed(m, lo.shape)
        if need_hi:
            m = F.binary("gt", x, hi)
            if lo is not None:
                m = F.binary("bitwise_or", m, F.binary("lt", hi, lo))
            dhi = routed(m, hi.shape)
        return dx, dlo, dhi


def unary(name: str, x: Tensor) -> Tensor:
    """f(x) elementwise for an activation `name` in NAMES (same shape and dtype)."""
    if name not in NAMES:
        raise ValueError(f"unary: unknown activation {name!r}; expected one of {NAMES}")
    return Unary.apply(x, name=name)


def _bound(name: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
        raise TypeError(f"clamp(): argument '{name}' must be a number or None, given "
                        f"{type(v).__name__}")
    v = float(v)
    if math.isnan(v):
        raise ValueError(f"clamp(): argument '{name}' must not be NaN")
    return v


def _clamp_tensor(input: Tensor, min: Any, max: Any) -> Tensor:  # noqa: A002
    """clamp with a Tensor bound: operands promoted as torch (a number bound counts as a
    Python scalar), broadcast together; gradients to input and to tensor bounds."""
    for name, v in (("min", min), ("max", max)):
        if isinstance(v, float) and math.isnan(v):
            raise ValueError(f"clamp(): argument '{name}' must not be NaN")
    dtype = result_type(input, *(v for v in (min, max) if v is not None))
    if dtype == np.bool_:
        raise TypeError("clamp(): not implemented for bool tensors")
    x, lo, hi = (None if v is None else convert_operand(v, dtype, input.device, "clamp")
                 for v in (input, min, max))
    return ClampTensor.apply(x, lo, hi)


def clamp(input: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    """torch.clamp: min(max(input, min), max) elementwise; either bound may be None, not
    both (as torch). Bounds are numbers or tensors broadcastable with input (the result has
    the broadcast shape and the promoted dtype; tensor bounds get gradients). NaN inputs
    stay NaN; where min > max every element is max. The gradient passes to input where
    min <= input <= max, to min where input < min < max, to max where input > max or
    max < min (torch)."""
    if isinstance(min, TensorBase) or isinstance(max, TensorBase):
        if min is None and max is None:
            raise ValueError("clamp(): at least one of 'min' or 'max' must not be None")
        return _clamp_tensor(input, min, max)
    lo, hi = _bound("min", min), _bound("max", max)
    if lo is None and hi is None:
        raise ValueError("clamp(): at least one of 'min' or 'max' must not be None")
    return Clamp.apply(input, lo=lo, hi=hi)


clip = clamp


def sigmoid(input: Tensor) -> Tensor:  # noqa: A002
    """1 / (1 + exp(-input))."""
    return Unary.apply(input, name="sigmoid")


def silu(input: Tensor) -> Tensor:  # noqa: A002
    """input * sigmoid(input)."""
    return Unary.apply(input, name="silu")


def log(input: Tensor) -> Tensor:  # noqa: A002
    return Unary.apply(input, name="log")


def sqrt(input: Tensor) -> Tensor:  # noqa: A002
    return Unary.apply(input, name="sqrt")


def rsqrt(input: Tensor) -> Tensor:  # noqa: A002
    """1 / sqrt(input)."""
    return Unary.apply(input, name="rsqrt")


def abs(input: Tensor) -> Tensor:  # noqa: A001, A002
    """|input|; its gradient is sign(input) (0 at 0)."""
    return Unary.apply(input, name="abs")


def exp(input: Tensor) -> Tensor:  # noqa: A002
    return Unary.apply(input, name="exp")


def tanh(input: Tensor) -> Tensor:  # noqa: A002
    return Unary.apply(input, name="tanh")


def relu(input: Tensor) -> Tensor:  # noqa: A002
    return Unary.apply(input, name="relu")
