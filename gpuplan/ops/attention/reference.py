"""float64 reference of the attention family, from the definitions: o = softmax(scale * q k^T
[causal mask]) v and its gradients by the chain rule through P, optionally with dropout
multipliers on P (keep / (1 - p)). Grouped-query attention: k and v may hold fewer entries
than q (a divisor G of its count); query entry b then uses K/V entry b // G, and the
gradient of K/V entry c is the sum of the per-query-entry gradients of its entries b with
b // G == c."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan.testing import f64

__all__ = ["attention_reference", "attention_backward_reference"]


def _kv_of_queries(q: Any, kv: Any) -> np.ndarray:
    """kv [Bkv, Lk, D] in float64 as seen by each of q's B entries: entry b // (B // Bkv)."""
    b, bkv = np.shape(q)[0], np.shape(kv)[0]
    if b == bkv:
        return f64(kv)
    if bkv == 0 or b % bkv:
        raise ValueError(f"attention_reference: k/v entries must divide q's, given {bkv} "
                         f"and {b}")
    return f64(kv)[np.arange(b) // (b // bkv)]


def _sum_to_kv(grad: np.ndarray, kv: Any) -> np.ndarray:
    """Per-query-entry gradients [B, Lk, D] summed into kv's [Bkv, Lk, D] entries."""
    bkv = np.shape(kv)[0]
    if grad.shape[0] == bkv:
        return grad
    out = np.zeros((bkv,) + grad.shape[1:])
    np.add.at(out, np.arange(grad.shape[0]) // (grad.shape[0] // bkv), grad)
    return out


def _attention_probs(q: Any, k: Any, scale: float, causal: bool) -> tuple[np.ndarray, ...]:
    """(P, lse) in float64 by the definition: P = softmax(scale * q k^T) over the unmasked
    keys (j > i + Lk - Lq masked when causal), 0 on fully masked rows, whose lse is -inf."""
    s = scale * np.einsum("bid,bjd->bij", f64(q), _kv_of_queries(q, k))
    lq, lk = s.shape[-2:]
    if causal:
        s[:, np.arange(lk)[None, :] > np.arange(lq)[:, None] + (lk - lq)] = -np.inf
    m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (np.where(np.isfinite(m), m, 0) + np.log(total))[..., 0]
    return e / np.where(total > 0, total, 1), lse


def attention_reference(q: Any, k: Any, v: Any, scale: float, causal: bool,
                        drop: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(o, lse) of attention in float64: o = (P * drop) v (q [B, Lq, D], k, v [B / G, Lk, D];
    drop [B, Lq, Lk] dropout multipliers, None for none); lse is the undropped softmax's."""
    p, lse = _attention_probs(q, k, scale, causal)
    return (p if drop is None else p * drop) @ _kv_of_queries(q, v), lse


def attention_backward_reference(q: Any, k: Any, v: Any, dout: Any, scale: float,
                                 causal: bool, drop: np.ndarray | None = None
                                 ) -> tuple[np.ndarray, ...]:
    """(dq, dk, dv) in float64 by the chain rule through P (and Pd = P * drop with dropout
    multipliers): dv = Pd^T dO, dP = (dO v^T) * drop, dS = scale P (dP - rowsum(dP P)),
    dq = dS k, dk = dS^T q; with k, v [B / G, Lk, D], dk and dv sum over each group."""
    p, _ = _attention_probs(q, k, scale, causal)
    dout = f64(dout)
    kq, vq = _kv_of_queries(q, k), _kv_of_queries(q, v)
    dp = dout @ np.swapaxes(vq, -1, -2)
    if drop is not None:
        dp = dp * drop
        dv = np.swapaxes(p * drop, -1, -2) @ dout
    else:
        dv = np.swapaxes(p, -1, -2) @ dout
    ds = scale * p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return ds @ kq, _sum_to_kv(np.swapaxes(ds, -1, -2) @ f64(q), k), _sum_to_kv(dv, v)
