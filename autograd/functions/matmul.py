"""Matrix-product Functions: matmul (2-D or batched) and linear (Y = X @ W + b, W [in, out])."""

from __future__ import annotations

from typing import Any

import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor import Tensor


class Matmul(Function):
    """C = A @ B for A [..., M, K], B [..., K, N] with equal batch dims, or either 2-D.

    dA = dC @ B^T, dB = A^T @ dC; a 2-D operand used across a batch gets the batch sum.
    """

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        if b.ndim == 2:  # fold a's batch into rows: one 2-D GEMM
            return F.matmul(a.reshape(-1, a.shape[-1]), b).reshape(a.shape[:-1] + b.shape[1:])
        batch = b.shape[:-2]
        b3 = b.reshape((-1,) + b.shape[-2:])
        a3 = a if a.ndim == 2 else a.reshape((-1,) + a.shape[-2:])
        return F.matmul(a3, b3).reshape(batch + (a.shape[-2], b.shape[-1]))

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved
        need_a, need_b = ctx.needs_input_grad
        da = db = None
        if b.ndim == 2:
            a2, dc2 = a.reshape(-1, a.shape[-1]), dc.reshape(-1, dc.shape[-1])
            if need_a:
                da = F.matmul(dc2, b, trans_b=True).reshape(a.shape)
            if need_b:
                db = F.matmul(a2, dc2, trans_a=True)
            return da, db
        b3 = b.reshape((-1,) + b.shape[-2:])
        dc3 = dc.reshape((-1,) + dc.shape[-2:])
        if need_a:
            da3 = F.matmul(dc3, b3, trans_b=True)
            da = (F.reduce("sum", da3, axes=0) if a.ndim == 2 else da3.reshape(a.shape))
        if need_b:
            a3 = a if a.ndim == 2 else a.reshape((-1,) + a.shape[-2:])
            db = F.matmul(a3, dc3, trans_a=True).reshape(b.shape)
        return da, db


def _check_matmul(a: Tensor, b: Tensor) -> None:
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul: operands must be at least 2-d, given {a.shape} @ {b.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: inner dims differ: {a.shape} @ {b.shape} "
                         f"({a.shape[-1]} != {b.shape[-2]})")
    if a.ndim > 2 and b.ndim > 2 and a.shape[:-2] != b.shape[:-2]:
        raise ValueError(f"matmul: batch dims differ: {a.shape} @ {b.shape} (only equal "
                         f"batches or a 2-d operand are supported)")


def matmul(a: Tensor, b: Tensor) -> Tensor:
    _check_matmul(a, b)
    return Matmul.apply(a, b)


class Linear(Function):
    """Y = X @ W + b; X [..., in], W [in, out], b [out] or None.

    dX = dY @ W^T, dW = X^T @ dY (rows of every leading dim), db = sum of dY rows.
    """

    @staticmethod
    def forward(ctx, x, w, bias):
        ctx.save_for_backward(x, w)
        x2 = x.reshape(-1, x.shape[-1])
        return F.matmul(x2, w, bias=bias).reshape(x.shape[:-1] + (w.shape[1],))

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
    if weight.ndim != 2 or x.shape[-1] != weight.shape[0]:
        raise ValueError(f"linear: expected x [..., in] and weight [in, out] with matching "
                         f"in, given x {x.shape} and weight {weight.shape}")
    if bias is not None and tuple(bias.shape) != (weight.shape[1],):
        raise ValueError(f"linear: bias must be [{weight.shape[1]}], given {bias.shape}")
    return Linear.apply(x, weight, bias)
