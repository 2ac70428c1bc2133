"""Matrix-product Functions: matmul (2-D or batched), linear (Y = X @ W + b, W [in, out]) and
linear_gelu (Y = gelu(X @ W + b), the activation fused into the GEMM's epilogue)."""

from __future__ import annotations

from typing import Any

import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor import Tensor


class Matmul(Function):
    """C = A @ B for A [..., M, K], B [..., K, N] with equal batch dims, or either 2-D
    (gp.functional.matmul folds, broadcasts and reports bad shapes).

    dA = dC @ B^T, dB = A^T @ dC; a 2-D operand used across a batch gets the batch sum.
    """

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return F.matmul(a, b)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved
        need_a, need_b = ctx.needs_input_grad
        da = db = None
        if need_a:
            da = F.matmul(dc, b, trans_b=True)
            if a.ndim == 2 and da.ndim > 2:  # a shared by every batch entry
                da = F.reduce("sum", da.reshape((-1,) + a.shape), axes=0)
        if need_b:
            if b.ndim == 2:  # b shared by every batch entry: fold the batch into rows
                db = F.matmul(a.reshape(-1, a.shape[-1]), dc.reshape(-1, dc.shape[-1]),
                              trans_a=True)
            else:
                db = F.matmul(a, dc, trans_a=True)
        return da, db


def matmul(a: Tensor, b: Tensor) -> Tensor:
    return Matmul.apply(a, b)


class Linear(Function):
    """Y = X @ W + b; X [..., in], W [in, out], b [out] or None.

    dX = dY @ W^T, dW = X^T @ dY (rows of every leading dim), db = sum of dY rows.
    """

    @staticmethod
    def forward(ctx, x, w, bias):
        ctx.save_for_backward(x, w)
        if x.ndim >= 2:  # gp.functional.matmul folds the leading dims into rows
            return F.matmul(x, w, bias=bias)
        return F.matmul(x.reshape(1, -1), w, bias=bias).reshape(w.shape[1:])

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved
        return _linear_grads(ctx.needs_input_grad, x, w, dy)


def _linear_grads(needs: tuple, x: Any, w: Any, dy: Any) -> tuple:
    """(dX, dW, db) of Y = X @ W + b, each None unless `needs` asks for it."""
    need_x, need_w, need_b = needs
    dy2 = dy.reshape(-1, dy.shape[-1])
    dx = F.matmul(dy2, w, trans_b=True).reshape(x.shape) if need_x else None
    dw = F.matmul(x.reshape(-1, x.shape[-1]), dy2, trans_a=True) if need_w else None
    db = F.reduce("sum", dy2, axes=0) if need_b else None
    return dx, dw, db


def linear(x: Tensor, weight: Tensor, bias: Any = None) -> Tensor:
    """x [..., in] @ weight [in, out] + bias [out]; the contraction and the bias are checked
    by gp.functional.matmul (its messages name 'a' = x, 'b' = weight)."""
    if weight.ndim != 2:
        raise ValueError(f"linear: expected a weight [in, out], given shape {weight.shape}")
    return Linear.apply(x, weight, bias)


class LinearGelu(Function):
    """Y = gelu(P), P = X @ W + b, in one GEMM: the activation runs in its epilogue, which
    also writes P when a gradient is needed (saved; nothing extra otherwise).

    dP = gelu'(P) * dY (gp unary_backward, the activation family's backward), then dX, dW,
    db as for Linear from dP. ``name``: "gelu" (erf) or "gelu_tanh".
    """

    @staticmethod
    def forward(ctx, x, w, bias, name):
        save = any(ctx.needs_input_grad)
        x2 = x if x.ndim >= 2 else x.reshape(1, -1)
        out = F.matmul(x2, w, bias=bias, epilogue=name, save_preact=save)
        y, pre = out if save else (out, None)
        if x.ndim < 2:
            y = y.reshape(w.shape[1:])
            pre = None if pre is None else pre.reshape(w.shape[1:])
        ctx.name = name
        ctx.save_for_backward(x, w, pre)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, pre = ctx.saved
        return _linear_grads(ctx.needs_input_grad, x, w, F.unary_backward(ctx.name, pre, dy))


def linear_gelu(x: Tensor, weight: Tensor, bias: Any = None, approximate: str = "none"
                ) -> Tensor:
    """gelu(x [..., in] @ weight [in, out] + bias [out]) with the activation in the GEMM's
    epilogue; the values of ``gelu(linear(x, weight, bias), approximate)``."""
    if weight.ndim != 2:
        raise ValueError(f"linear_gelu: expected a weight [in, out], given shape {weight.shape}")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"linear_gelu: approximate must be 'none' or 'tanh', given "
                         f"{approximate!r}")
    return LinearGelu.apply(x, weight, bias, name="gelu" if approximate == "none" else "gelu_tanh")
