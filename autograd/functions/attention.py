"""Scaled dot-product attention: the fused attention plans (FlashAttention-2 style: no
[Lq, Lk] buffer, backward recomputes P from the saved log-sum-exp), or, where they do not
apply (a value width unlike the query width, or a head_dim over the device kernels' limit),
the composed matmul -> softmax -> matmul."""

from __future__ import annotations

import math
from typing import Any

import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor import Tensor
from gpuplan.ops.attention import MAX_HEAD_DIM


def _fold(a: Any) -> Any:
    """[..., L, D] as [batch, L, D] (leading axes folded; a copy only where needed)."""
    return a.reshape((-1,) + a.shape[-2:])


class ScaledDotProductAttention(Function):
    """O = softmax(scale * Q K^T [causal mask]) V over [..., L, D] (batch dims folded), by
    the fused plans: forward saves Q, K, V, O and the per-row log-sum-exp; backward gets
    dQ, dK, dV from them (gpuplan.ops.attention_backward: dS = P (dO V^T - rowsum(dO O)),
    dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO, P recomputed tile by tile)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal):
        q3, k3, v3 = _fold(q), _fold(k), _fold(v)
        o, lse = F.attention(q3, k3, v3, scale=scale, causal=causal)
        ctx.scale, ctx.causal = scale, causal
        ctx.save_for_backward(q3, k3, v3, o, lse)
        ctx.shapes = (q.shape, k.shape, v.shape)
        return o.reshape(q.shape)

    @staticmethod
    def backward(ctx, dout):
        q3, k3, v3, o, lse = ctx.saved
        grads = F.attention_backward(q3, k3, v3, o, lse, _fold(dout), scale=ctx.scale,
                                     causal=ctx.causal)
        return tuple(g.reshape(shape) if need else None for g, shape, need in
                     zip(grads, ctx.shapes, ctx.needs_input_grad, strict=True))


class ComposedAttention(Function):
    """The same O as three plans: matmul, softmax (causal, scaled), matmul; Q, K, V and P are
    saved. With P the probabilities: dV = P^T dO, dP = dO V^T,
    dS = scale * P * (dP - rowsum(dP*P)), dQ = dS K, dK = dS^T Q. Takes V [..., Lk, Dv] of
    any width Dv."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal):
        q3, k3, v3 = _fold(q), _fold(k), _fold(v)
        scores = F.matmul(q3, k3, trans_b=True)  # [B, Lq, Lk]
        p = F.softmax(scores, scale=scale, causal=causal)
        out = F.matmul(p, v3)  # [B, Lq, Dv]
        ctx.scale, ctx.causal = scale, causal
        ctx.save_for_backward(q3, k3, v3, p)
        ctx.shapes = (q.shape, k.shape, v.shape)
        return out.reshape(q.shape[:-1] + (v.shape[-1],))

    @staticmethod
    def backward(ctx, dout):
        q3, k3, v3, p = ctx.saved
        q_shape, k_shape, v_shape = ctx.shapes
        do3 = _fold(dout)
        need_q, need_k, need_v = ctx.needs_input_grad
        dv = F.matmul(p, do3, trans_a=True).reshape(v_shape) if need_v else None
        dq = dk = None
        if need_q or need_k:
            dp = F.matmul(do3, v3, trans_b=True)
            ds = F.softmax_backward(p, dp, scale=ctx.scale, causal=ctx.causal)
            dq = F.matmul(ds, k3).reshape(q_shape) if need_q else None
            dk = F.matmul(ds, q3, trans_a=True).reshape(k_shape) if need_k else None
        return dq, dk, dv


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                                 scale: Any = None) -> Tensor:
    """q [..., Lq, Dh], k [..., Lk, Dh], v [..., Lk, Dv] -> [..., Lq, Dv]; scale defaults
    to 1/sqrt(Dh). Causal masks (i, j) when j > i + (Lk - Lq) (equals PyTorch's for Lq == Lk).
    Fused plans when Dv == Dh <= 128 (every device, so results agree across devices), the
    composed ops otherwise.
    """
    if q.ndim < 3 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"scaled_dot_product_attention: q, k, v must share a rank >= 3, "
                         f"given {q.shape}, {k.shape}, {v.shape}")
    if (q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]
            or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]):
        raise ValueError(f"scaled_dot_product_attention: incompatible shapes q {q.shape}, "
                         f"k {k.shape}, v {v.shape} (expected [..., Lq, Dh], [..., Lk, Dh], "
                         f"[..., Lk, Dv])")
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    fused = v.shape[-1] == q.shape[-1] <= MAX_HEAD_DIM
    fn = ScaledDotProductAttention if fused else ComposedAttention
    return fn.apply(q, k, v, scale=s, causal=bool(is_causal))
