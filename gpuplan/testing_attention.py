"""float64 reference of the attention family (tests and kernel cases), from the definitions:
o = softmax(scale * q k^T [causal mask]) v and its gradients by the chain rule through P.
(Beside gpuplan.testing, which holds the other families' references.)"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan.testing import f64

__all__ = ["attention_reference", "attention_backward_reference"]


def _attention_probs(q: Any, k: Any, scale: float, causal: bool) -> tuple[np.ndarray, ...]:
    """(P, lse) in float64 by the definition: P = softmax(scale * q k^T) over the unmasked
    keys (j > i + Lk - Lq masked when causal), 0 on fully masked rows, whose lse is -inf."""
    s = scale * np.einsum("bid,bjd->bij", f64(q), f64(k))
    lq, lk = s.shape[-2:]
    if causal:
        s[:, np.arange(lk)[None, :] > np.arange(lq)[:, None] + (lk - lq)] = -np.inf
    m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (np.where(np.isfinite(m), m, 0) + np.log(total))[..., 0]
    return e / np.where(total > 0, total, 1), lse


def attention_reference(q: Any, k: Any, v: Any, scale: float, causal: bool
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(o, lse) of attention in float64: o = P v (q [B, Lq, D], k, v [B, Lk, D])."""
    p, lse = _attention_probs(q, k, scale, causal)
    return p @ f64(v), lse


def attention_backward_reference(q: Any, k: Any, v: Any, dout: Any, scale: float,
                                 causal: bool) -> tuple[np.ndarray, ...]:
    """(dq, dk, dv) in float64 by the chain rule through P: dv = P^T dO, dP = dO v^T,
    dS = scale P (dP - rowsum(dP P)), dq = dS k, dk = dS^T q."""
    p, _ = _attention_probs(q, k, scale, causal)
    dout = f64(dout)
    dp = dout @ np.swapaxes(f64(v), -1, -2)
    ds = scale * p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return ds @ f64(k), np.swapaxes(ds, -1, -2) @ f64(q), np.swapaxes(p, -1, -2) @ dout
