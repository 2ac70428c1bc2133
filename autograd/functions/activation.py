"""Elementwise activation Functions (relu, gelu, gelu_tanh, silu, tanh, exp) via the plans."""

from __future__ import annotations

import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor import Tensor

NAMES = ("relu", "gelu", "gelu_tanh", "silu", "tanh", "exp")


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


def unary(name: str, x: Tensor) -> Tensor:
    if name not in NAMES:
        raise ValueError(f"unary: unknown activation {name!r}; expected one of {NAMES}")
    return Unary.apply(x, name=name)
