"""Layer norm and RMS norm Functions over the trailing `normalized_shape` dims, and the
fused residual add + layer norm of a pre-LN transformer block."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gpuplan.functional as F
from autograd.function import Function
from gpuplan.dtypes import eps as machine_eps

if TYPE_CHECKING:
    from autograd.tensor import Tensor


def _vec(p: Any, d: int) -> Any:
    return None if p is None else p.reshape(d)


class LayerNorm(Function):
    """y = (x - mean) * rstd * weight + bias over the last D elements (x viewed [R, D]).

    Inputs x, weight or None, bias or None (normalized_shape, D elements); mean/rstd [R]
    are saved. dbias is the column sum of dy (taken from dy when there is no weight).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, d, eps):
        x2 = x.reshape(-1, d)
        w, b = weight, bias
        if not (w is None or w.ndim == 1) or not (b is None or b.ndim == 1):
            w, b = _vec(w, d), _vec(b, d)  # [D] views of multi-dim parameters
        y, mean, rstd = F.layer_norm(x2, w, b, eps=eps)
        ctx.d = d
        ctx.bias_shape = None if bias is None else bias.shape
        ctx.save_for_backward(x2, weight, mean, rstd)
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved
        d = ctx.d
        dy2 = dy.reshape(-1, d)
        dx, dw, db = F.layer_norm_backward(dy2, x2, _vec(weight, d), mean, rstd)
        need_x, need_w, need_b = ctx.needs_input_grad
        dx = dx.reshape(dy.shape) if need_x else None
        dw = dw.reshape(weight.shape) if need_w else None
        return dx, dw, (db.reshape(ctx.bias_shape) if need_b else None)


class ResidualLayerNorm(Function):
    """(s, y) with s = x + r and y = LayerNorm(s) over the last D elements, one plan.

    Inputs x, r (one shape), weight or None, bias or None; s, mean and rstd are saved.
    backward(ds, dy): dx = dr = LayerNorm's input gradient of dy at s, plus ds (one plan);
    dweight and dbias as for LayerNorm.
    """

    @staticmethod
    def forward(ctx, x, r, weight, bias, d, eps):
        s, y, mean, rstd = F.residual_layer_norm(x.reshape(-1, d), r.reshape(-1, d),
                                                 _vec(weight, d), _vec(bias, d), eps=eps)
        ctx.d = d
        ctx.bias_shape = None if bias is None else bias.shape
        ctx.save_for_backward(s, weight, mean, rstd)
        return s.reshape(x.shape), y.reshape(x.shape)

    @staticmethod
    def backward(ctx, ds, dy):
        s, weight, mean, rstd = ctx.saved
        d = ctx.d
        dx, dw, db = F.residual_layer_norm_backward(dy.reshape(-1, d), s, _vec(weight, d),
                                                    mean, rstd, ds=ds.reshape(-1, d))
        need_x, need_r, need_w, need_b = ctx.needs_input_grad
        dx = dx.reshape(dy.shape)
        return (dx if need_x else None, dx if need_r else None,
                dw.reshape(weight.shape) if need_w else None,
                db.reshape(ctx.bias_shape) if need_b else None)


class RMSNorm(Function):
    """y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps) over the last D elements."""

    @staticmethod
    def forward(ctx, x, weight, d, eps):
        x2 = x.reshape(-1, d)
        y, rstd = F.rms_norm(x2, _vec(weight, d), eps=eps)
        ctx.d = d
        ctx.save_for_backward(x2, weight, rstd)
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved
        dx, dw = F.rms_norm_backward(dy.reshape(-1, ctx.d), x2, _vec(weight, ctx.d), rstd)
        need_x, need_w = ctx.needs_input_grad
        return (dx.reshape(dy.shape) if need_x else None,
                dw.reshape(weight.shape) if need_w else None)


def _norm_size(x: Tensor, normalized_shape: int | Sequence[int], op: str
               ) -> tuple[int, tuple[int, ...]]:
    shape = ((int(normalized_shape),) if isinstance(normalized_shape, int)
             else tuple(map(int, normalized_shape)))
    x_shape = x.shape
    n = len(shape)
    if n > len(x_shape) or tuple(x_shape[len(x_shape) - n:]) != shape:
        raise ValueError(f"{op}: normalized_shape {shape} must match the trailing dims of "
                         f"the input, given input shape {x_shape}")
    return math.prod(shape), shape


def _check_affine(p: Any, shape: tuple, op: str, name: str) -> None:
    if p is not None and tuple(p.shape) != shape:
        raise ValueError(f"{op}: {name} must have normalized_shape {shape}, given {p.shape}")


def layer_norm(x: Tensor, normalized_shape: int | Sequence[int], weight: Any = None,
               bias: Any = None, eps: float = 1e-5) -> Tensor:
    d, shape = _norm_size(x, normalized_shape, "layer_norm")
    _check_affine(weight, shape, "layer_norm", "weight")
    _check_affine(bias, shape, "layer_norm", "bias")
    return LayerNorm.apply(x, weight, bias, d=d, eps=float(eps))


def residual_layer_norm(x: Tensor, residual: Tensor, normalized_shape: int | Sequence[int],
                        weight: Any = None, bias: Any = None, eps: float = 1e-5
                        ) -> tuple[Tensor, Tensor]:
    """``(s, layer_norm(s, normalized_shape, weight, bias, eps))`` with ``s = x + residual``
    (x and residual of one shape), in one pass: a pre-LN block's residual stream feeding
    its next LayerNorm. The values of the composed ops."""
    if tuple(residual.shape) != tuple(x.shape):
        raise ValueError(f"residual_layer_norm: residual must have the input's shape "
                         f"{tuple(x.shape)}, given {tuple(residual.shape)}")
    d, shape = _norm_size(x, normalized_shape, "residual_layer_norm")
    _check_affine(weight, shape, "residual_layer_norm", "weight")
    _check_affine(bias, shape, "residual_layer_norm", "bias")
    return ResidualLayerNorm.apply(x, residual, weight, bias, d=d, eps=float(eps))


def rms_norm(x: Tensor, normalized_shape: int | Sequence[int], weight: Any = None,
             eps: float | None = None) -> Tensor:
    """eps=None uses the machine epsilon of x's dtype (as PyTorch does)."""
    d, shape = _norm_size(x, normalized_shape, "rms_norm")
    _check_affine(weight, shape, "rms_norm", "weight")
    return RMSNorm.apply(x, weight, d=d, eps=float(machine_eps(x.dtype) if eps is None else eps))
