"""Layer norm and RMS norm Functions over the trailing `normalized_shape` dims."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor import Tensor
from gpuplan.dtypes import eps as machine_eps


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
        y, mean, rstd = F.layer_norm(x2, _vec(weight, d), _vec(bias, d), eps=eps)
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
             else tuple(int(s) for s in normalized_shape))
    if len(shape) > x.ndim or tuple(x.shape[x.ndim - len(shape):]) != shape:
        raise ValueError(f"{op}: normalized_shape {shape} must match the trailing dims of "
                         f"the input, given input shape {x.shape}")
    d = 1
    for s in shape:
        d *= s
    return d, shape


def _check_affine(p: Any, shape: tuple, op: str, name: str) -> None:
    if p is not None and tuple(p.shape) != shape:
        raise ValueError(f"{op}: {name} must have normalized_shape {shape}, given {p.shape}")


def layer_norm(x: Tensor, normalized_shape: int | Sequence[int], weight: Any = None,
               bias: Any = None, eps: float = 1e-5) -> Tensor:
    d, shape = _norm_size(x, normalized_shape, "layer_norm")
    _check_affine(weight, shape, "layer_norm", "weight")
    _check_affine(bias, shape, "layer_norm", "bias")
    return LayerNorm.apply(x, weight, bias, d=d, eps=float(eps))


def rms_norm(x: Tensor, normalized_shape: int | Sequence[int], weight: Any = None,
             eps: float | None = None) -> Tensor:
    """eps=None uses the machine epsilon of x's dtype (as PyTorch does)."""
    d, shape = _norm_size(x, normalized_shape, "rms_norm")
    _check_affine(weight, shape, "rms_norm", "weight")
    return RMSNorm.apply(x, weight, d=d, eps=float(machine_eps(x.dtype) if eps is None else eps))
