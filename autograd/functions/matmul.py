"""Matrix-product Functions: matmul (torch.matmul: vectors, broadcast batches), linear
(Y = X @ W + b, W [in, out]) and linear_gelu (Y = gelu(X @ W + b), the activation fused into
the GEMM's epilogue)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor_base import TensorBase, new_tensor
from gpuplan import backend

if TYPE_CHECKING:
    from autograd.tensor import Tensor


def _sum_to(g: Any, shape: tuple[int, ...]) -> Any:
    """A gradient g ([*batch, r, c], or [r, c] already summed) of an operand of `shape`
    ([*b, r, c]): summed over the batch axes the operand was broadcast along, reshaped."""
    if g.ndim > 2:
        lead = g.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, e in enumerate(shape[:-2])
                                          if e == 1 and g.shape[lead + i] != 1)
        if axes:
            g = F.reduce("sum", g, axes=axes, keepdims=False)
    return g if tuple(g.shape) == tuple(shape) else g.reshape(shape)


def _operand(x: Any, batch: tuple[int, ...]) -> Any:
    """What the GEMM gets for one operand [*b, r, c] under the broadcast batch `batch`: the
    2-D matrix when b has one entry (the plan's batch stride 0), x itself when b == batch,
    else x materialized over `batch` (the plan takes one batch stride per operand, which
    cannot express a partial broadcast such as (2, 1) against (2, 3))."""
    b = tuple(x.shape[:-2])
    if math.prod(b) == 1:
        return x.reshape(x.shape[-2:])
    if b == batch:
        return x
    xp = gp.array_namespace(x)
    return backend.ascontiguous(xp.broadcast_to(x, batch + tuple(x.shape[-2:])))


class Matmul(Function):
    """C = A @ B for A [*ba, M, K], B [*bb, K, N] (rank >= 2: vectors are promoted by
    `matmul`), the batch axes broadcast like torch.matmul to batch = broadcast(ba, bb).

    dA = dC @ B^T, dB = A^T @ dC over the broadcast batch, then summed over the batch axes
    each operand was broadcast along. A single-entry batch operand runs as a 2-D matrix (the
    GEMM plan's batch stride 0); a partially broadcast one is materialized.
    """

    @staticmethod
    def forward(ctx, a, b):
        try:
            batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        except ValueError:
            raise ValueError(f"matmul: batch axes {a.shape[:-2]} and {b.shape[:-2]} do not "
                             f"broadcast (shapes {a.shape} @ {b.shape})") from None
        ea, eb = _operand(a, batch), _operand(b, batch)
        ctx.batch, ctx.a_shape, ctx.b_shape = batch, a.shape, b.shape
        ctx.save_for_backward(ea, eb)
        out = F.matmul(ea, eb)
        shape = batch + out.shape[-2:]
        return out if out.shape == shape else out.reshape(shape)

    @staticmethod
    def backward(ctx, dc):
        ea, eb = ctx.saved
        need_a, need_b = ctx.needs_input_grad
        if ea.ndim == 2 and eb.ndim == 2:
            dc = dc.reshape(dc.shape[-2:])  # a batch of ones at most

        def grad_a():
            da = F.matmul(dc, eb, trans_b=True)
            if ea.ndim == 2 and da.ndim > 2:  # a shared by every batch entry
                da = F.reduce("sum", da, axes=tuple(range(da.ndim - 2)))
            return _sum_to(da, ctx.a_shape)

        def grad_b():
            if eb.ndim == 2 and ea.ndim > 2:  # b shared by every batch entry: fold rows
                db = F.matmul(ea.reshape(-1, ea.shape[-1]), dc.reshape(-1, dc.shape[-1]),
                              trans_a=True)
            else:
                db = F.matmul(ea, dc, trans_a=True)
            return _sum_to(db, ctx.b_shape)

        # Independent products: on the host, one per thread at two threads (gp.concurrently).
        work = math.prod(dc.shape) * ea.shape[-1]  # multiply-adds of each product
        da, db = gp.concurrently(dc, grad_a if need_a else None, grad_b if need_b else None,
                                 work=work)
        return da, db


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """torch.matmul: 1-D operands are vectors (a [K] is [1, K], b [K] is [K, 1], the added
    axis removed from the result); batch axes broadcast."""
    if not isinstance(b, TensorBase):
        b = new_tensor(gp.asarray(b, device=a.device))
    if not isinstance(a, TensorBase):
        a = new_tensor(gp.asarray(a, device=b.device))
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: both operands need at least one dimension, given shapes "
                         f"{a.shape} and {b.shape}")
    va, vb = a.ndim == 1, b.ndim == 1
    out = Matmul.apply(a.reshape(1, -1) if va else a, b.reshape(-1, 1) if vb else b)
    if va or vb:
        shape = out.shape[:-2] + (() if va else out.shape[-2:-1]) + (() if vb else
                                                                      out.shape[-1:])
        out = out.reshape(shape)
    return out


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
    # Two independent products of equal work: on the host, one per thread when the
    # threads are no more than two (gp.concurrently).
    dx, dw = gp.concurrently(
        dy2, (lambda: F.matmul(dy2, w, trans_b=True).reshape(x.shape)) if need_x else None,
        (lambda: F.matmul(x.reshape(-1, x.shape[-1]), dy2, trans_a=True)) if need_w else None,
        work=dy2.size * w.shape[0])
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

    dP = gelu'(P) * dY (gp unary_backward, the activation family's backward, given Y too),
    then dX, dW, db as for Linear from dP. ``name``: "gelu" (erf) or "gelu_tanh".
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
        # y too: the host f32 gelu backward takes Phi = y / P from it instead of erf (the
        # next op, the MLP's projection, holds y for its own backward anyway).
        ctx.save_for_backward(x, w, pre, y if save else None)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, pre, y = ctx.saved
        return _linear_grads(ctx.needs_input_grad, x, w,
                             F.unary_backward(ctx.name, pre, dy, y=y))


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
