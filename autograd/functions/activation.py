"""Elementwise unary Functions via the activation plans: relu, gelu, gelu_tanh, silu, tanh,
exp, log, sqrt, rsqrt, sigmoid, abs, and clamp (optional min / max, as torch.clamp)."""

from __future__ import annotations

import math
from typing import Any

import gpuplan.functional as F
from autograd.function import Function
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


def unary(name: str, x: Tensor) -> Tensor:
    """f(x) elementwise for an activation `name` in NAMES (same shape and dtype)."""
    if name not in NAMES:
        raise ValueError(f"unary: unknown activation {name!r}; expected one of {NAMES}")
    return Unary.apply(x, name=name)


def _bound(name: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, Tensor):
        if v.numel() != 1:
            raise TypeError(f"clamp(): argument '{name}' must be a number or a one-element "
                            f"tensor, given a tensor of shape {v.shape}")
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
        raise TypeError(f"clamp(): argument '{name}' must be a number or None, given "
                        f"{type(v).__name__}")
    v = float(v)
    if math.isnan(v):
        raise ValueError(f"clamp(): argument '{name}' must not be NaN")
    return v


def clamp(input: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    """torch.clamp: min(max(input, min), max) elementwise; either bound may be None, not
    both (as torch). NaN inputs stay NaN; where min > max every element is max. The
    gradient passes where min <= input <= max."""
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
