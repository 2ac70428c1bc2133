"""float64 references of the normalization family from the definitions: LayerNorm and
RMSNorm over the last axis, and their gradients by the chain rule. Written with NumPy alone:
nothing is imported from the family's plans.py, host.py or rows.py."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan.testing import f64

__all__ = ["layer_norm_reference", "layer_norm_backward_reference",
           "rms_norm_backward_reference"]


def layer_norm_reference(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5,
                         rms: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm (RMSNorm when `rms`: no centring, no bias) over the last axis in float64:
    (y, mean, rstd), mean zeros for RMSNorm, rstd = 1 / sqrt(mean((x - mean)^2) + eps); a
    D = 0 row has mean 0 and rstd 1 / sqrt(eps) (the kernels' convention)."""
    x = f64(x)
    n = max(x.shape[-1], 1)
    mean = np.zeros(x.shape[:-1]) if rms else x.sum(axis=-1) / n
    c = x - mean[..., None]
    rstd = 1.0 / np.sqrt((c * c).sum(axis=-1) / n + eps)
    y = c * rstd[..., None]
    if weight is not None:
        y = y * f64(weight)
    if bias is not None:
        y = y + f64(bias)
    return y, mean, rstd


def layer_norm_backward_reference(dy: Any, x: Any, weight: Any = None, eps: float = 1e-5
                                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dweight, dbias) of LayerNorm over the last axis of 2-D x in float64, statistics
    from x (`layer_norm_reference`): with xhat = (x - mean) * rstd and g = dy * weight,
    dx = rstd * (g - mean_d(g) - xhat * mean_d(g * xhat)), dweight = sum_r dy * xhat,
    dbias = sum_r dy."""
    x, dy = f64(x), f64(dy)
    _, mean, rstd = layer_norm_reference(x, eps=eps)
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy if weight is None else dy * f64(weight)
    dx = rstd[:, None] * (g - g.mean(axis=1, keepdims=True)
                          - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def rms_norm_backward_reference(dy: Any, x: Any, weight: Any = None, eps: float = 1e-6
                                ) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dweight) of RMSNorm over the last axis of 2-D x in float64, rstd from x: with
    y = x * rstd * weight, rstd = 1 / sqrt(mean_d(x^2) + eps), xhat = x * rstd and
    g = dy * weight, d rstd / dx_i = -rstd^3 x_i / D gives
    dx = rstd * (g - xhat * mean_d(g * xhat)), dweight = sum_r dy * xhat."""
    x, dy = f64(x), f64(dy)
    d = max(x.shape[1], 1)
    rstd = 1.0 / np.sqrt((x * x).sum(axis=1) / d + eps)
    xhat = x * rstd[:, None]
    g = dy if weight is None else dy * f64(weight)
    dx = rstd[:, None] * (g - xhat * ((g * xhat).sum(axis=1) / d)[:, None])
    return dx, (dy * xhat).sum(axis=0)
