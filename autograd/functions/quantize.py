"""Per-token int8 quantize/dequantize Functions with straight-through gradients."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gpuplan.functional as F
from autograd.function import Function
from gpuplan.dtypes import as_dtype

if TYPE_CHECKING:
    from autograd.tensor import Tensor


class QuantizePerToken(Function):
    """(q int8 [N, D], scale f32 [N]) with scale = max|x_n| / 127, q = round(x / scale).

    Straight-through: d_x = d_q (cast to x's dtype); scale is not differentiable.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.dtype = x.dtype
        q, scale = F.quantize_per_token(x)
        ctx.mark_non_differentiable(scale)
        return q, scale

    @staticmethod
    def backward(ctx, d_q, d_scale):
        return F.quantize_per_token_backward(d_q, dtype=ctx.dtype)


class DequantizePerToken(Function):
    """y [N, D] = scale[n] * q[n, d] in `dtype`; d_q = scale[n] * d_y (straight-through)."""

    @staticmethod
    def forward(ctx, q, scale, dtype):
        ctx.save_for_backward(scale)
        return F.dequantize_per_token(q, scale, dtype)

    @staticmethod
    def backward(ctx, dy):
        (scale,) = ctx.saved
        return F.dequantize_per_token_backward(scale, dy), None


def quantize_per_token(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [N, D] (gpuplan's functional checks the rank: InvalidProblem, a ValueError)."""
    return QuantizePerToken.apply(x)


def dequantize_per_token(q: Tensor, scale: Any, dtype: Any = None) -> Tensor:
    """dtype defaults to float32."""
    return DequantizePerToken.apply(q, scale, dtype=as_dtype(dtype or "float32"))
