"""float64 references of the residual_norm family: s = x + residual and y = LayerNorm(s)
over the last axis, and its gradients, built on the normalization family's references."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan.ops.normalization.reference import layer_norm_backward_reference, layer_norm_reference
from gpuplan.testing import f64

__all__ = ["residual_layer_norm_backward_reference", "residual_layer_norm_reference"]


def residual_layer_norm_reference(x: Any, residual: Any, weight: Any = None, bias: Any = None,
                                  eps: float = 1e-5) -> tuple[np.ndarray, ...]:
    """(s, y, mean, rstd) in float64 for x, residual [rows, dim]: s = x + residual exactly
    (the plans round s to the dtype before normalizing it: that rounding is their error),
    y = (s - mean) * rstd * weight + bias with mean and rstd = 1 / sqrt(var + eps) of each
    row of s (layer_norm_reference)."""
    s = f64(x) + f64(residual)
    y, mean, rstd = layer_norm_reference(s, weight, bias, eps)
    return s, y, mean, rstd


def residual_layer_norm_backward_reference(dy: Any, s: Any, weight: Any = None, ds: Any = None,
                                           eps: float = 1e-5) -> tuple[np.ndarray, ...]:
    """(dx, dweight, dbias) in float64 from dy and s [rows, dim] (statistics from s): dx is
    LayerNorm's input gradient at s plus ds (the gradient reaching s from its other use; the
    same for x and residual), dweight = sum_r dy * shat, dbias = sum_r dy
    (layer_norm_backward_reference)."""
    dx, dweight, dbias = layer_norm_backward_reference(dy, s, weight, eps)
    return (dx if ds is None else dx + f64(ds)), dweight, dbias
