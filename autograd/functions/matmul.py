"""Matrix-product Functions: matmul (2-D or batched) and linear (Y = X @ W + b, W [in, out])."""

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
        need_x, need_w, need_b = ctx.needs_input_grad
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
