"""Scaled dot-product attention as one Function: matmul, softmax (causal, scaled), matmul."""

from __future__ import annotations

import math
from typing import Any

import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor import Tensor


class ScaledDotProductAttention(Function):
    """O = softmax(scale * Q K^T [causal mask]) V over [..., L, Dh] (batch dims folded).

    With P the probabilities: dV = P^T dO, dP = dO V^T, dS = scale * P * (dP - rowsum(dP*P)),
    dQ = dS K, dK = dS^T Q. Q, K, V and P are saved.
    """

    @staticmethod
    def forward(ctx, q, k, v, scale, causal):
        shape = q.shape
        q3 = q.reshape((-1,) + q.shape[-2:])
        k3 = k.reshape((-1,) + k.shape[-2:])
        v3 = v.reshape((-1,) + v.shape[-2:])
        scores = F.matmul(q3, k3, trans_b=True)  # [B, Lq, Lk]
        p = F.softmax(scores, scale=scale, causal=causal)
        out = F.matmul(p, v3)  # [B, Lq, Dv]
        ctx.scale, ctx.causal = scale, causal
        ctx.save_for_backward(q3, k3, v3, p)
        ctx.shapes = (shape, k.shape, v.shape)
        return out.reshape(shape[:-1] + (v.shape[-1],))

    @staticmethod
    def backward(ctx, dout):
        q3, k3, v3, p = ctx.saved
        q_shape, k_shape, v_shape = ctx.shapes
        do3 = dout.reshape((-1,) + dout.shape[-2:])
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
    return ScaledDotProductAttention.apply(q, k, v, scale=s, causal=bool(is_causal))
