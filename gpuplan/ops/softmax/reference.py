"""float64 references of the softmax family from the definitions: (log-)softmax(scale * x)
over one axis with an optional mask (the causal one from `causal_mask`), and its
vector-Jacobian product from the forward output."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan.testing import f64

__all__ = ["causal_mask", "softmax_backward_reference", "softmax_reference"]


def causal_mask(rows: int, q_len: int, k_len: int) -> np.ndarray:
    """[rows, k_len] bool, True where masked: row r is query i = r % q_len and key j is
    masked when j > i + (k_len - q_len) (queries aligned to the end of the keys)."""
    i = np.arange(rows) % q_len
    return np.arange(k_len)[None, :] > (i + k_len - q_len)[:, None]


def softmax_reference(x: Any, scale: float = 1.0, mask: Any = None, log: bool = False,
                      axis: int = -1) -> np.ndarray:
    """(log-)softmax(z) along `axis` in float64, z = scale * x with -inf where `mask` (True
    where masked, broadcast against x): p_j = exp(z_j - lse), lse = log sum_k exp(z_k) over
    the unmasked finite z_k; log-softmax z_j - lse. Masked and -inf positions give 0
    (log: -inf), and so does every position of a row with none left."""
    z = f64(x) * scale
    if mask is not None:
        z = np.where(mask, -np.inf, z)
    z = np.moveaxis(z, axis, -1)
    rows = z.reshape(-1, z.shape[-1])
    out = np.zeros_like(rows) if not log else np.full_like(rows, -np.inf)
    for r in range(rows.shape[0]):
        keep = np.isfinite(rows[r])
        if not keep.any():
            continue
        zr = rows[r, keep]
        lse = np.log(np.sum(np.exp(zr - zr.max()))) + zr.max()
        out[r, keep] = zr - lse if log else np.exp(zr - lse)
    return np.moveaxis(out.reshape(z.shape), -1, axis)


def softmax_backward_reference(y: Any, dy: Any, scale: float = 1.0, log: bool = False,
                               mask: Any = None) -> np.ndarray:
    """dx of (log-)softmax(scale * x) over the last axis in float64, from the forward output y
    (p = y, or p = exp(y) for log-softmax) and dy [..., dim]:
    softmax dx = scale * p * (dy - sum_j dy_j * p_j), log-softmax dx = scale * (dy - p * sum_j
    dy_j); the sums run over the unmasked positions and masked positions get dx = 0."""
    y, dy = f64(y), f64(dy)
    if mask is not None:
        dy = np.where(mask, 0.0, dy)
    p = np.exp(y) if log else y
    if log:
        dx = scale * (dy - p * dy.sum(axis=-1, keepdims=True))
    else:
        dx = scale * p * (dy - (dy * p).sum(axis=-1, keepdims=True))
    return dx if mask is None else np.where(mask, 0.0, dx)
