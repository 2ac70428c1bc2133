"""float64 references of the cross-entropy family (row losses, reductions, gradients) from
the definitions, written with NumPy alone (nothing from the family's plans.py or partial.py),
and a one-process driver of the vocabulary-parallel stages (which runs them: no reference)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import gpuplan as gp
from gpuplan.testing import f64

__all__ = [
    "cross_entropy_reference",
    "cross_entropy_reduce_reference",
    "cross_entropy_grad_reference",
    "cross_entropy_over_blocks",
]


def cross_entropy_reference(logits: Any, target: Any, smoothing: float = 0.0,
                            ignore_index: int = -100) -> tuple[np.ndarray, np.ndarray]:
    """(per-row loss, lse) in float64 from the definitions: -log p_t with p = exp(x) /
    sum exp(x), smoothed with the mean of -log p_j; the loss is 0 on ignored rows."""
    x = f64(logits)
    out, lse = np.zeros(x.shape[0]), np.zeros(x.shape[0])
    for n, t in enumerate(gp.to_host(target).tolist()):
        m = x[n].max()
        lse[n] = m + np.log(np.exp(x[n] - m).sum())
        logp = x[n] - lse[n]
        if t != ignore_index:
            out[n] = (1 - smoothing) * -logp[t] + smoothing * np.mean(-logp)
    return out, lse


def cross_entropy_reduce_reference(rows: np.ndarray, target: Any, reduction: str,
                                   ignore_index: int = -100) -> np.ndarray:
    """The per-row losses reduced: as is ('none'), summed, or over the non-ignored rows (NaN
    when every row is ignored, as PyTorch's 0 / 0)."""
    if reduction == "none":
        return rows
    total = rows.sum()
    keep = np.count_nonzero(gp.to_host(target) != ignore_index)
    if reduction == "sum":
        return total
    return total / keep if keep else np.float64(np.nan)


def cross_entropy_grad_reference(logits: Any, target: Any, smoothing: float, dloss: Any,
                                 reduction: str, ignore_index: int = -100) -> np.ndarray:
    """d(reduced loss)/d logits in float64 by the chain rule, d(-log p_k)/dx_j = p_j - [j == k],
    times dloss ([N] for 'none', else a scalar)."""
    x, t, dloss = f64(logits), gp.to_host(target), f64(dloss)
    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    g = np.zeros_like(x)
    for n, k in enumerate(t.tolist()):
        if k == ignore_index:
            continue
        onehot = np.zeros(x.shape[1])
        onehot[k] = 1
        dn = (1 - smoothing) * (p[n] - onehot) + smoothing * (p[n] - 1.0 / x.shape[1])
        w = dloss[n] if reduction == "none" else dloss
        g[n] = w * dn / (np.count_nonzero(t != ignore_index) if reduction == "mean" else 1)
    return g


def cross_entropy_over_blocks(blocks: Sequence[Any], target: Any, ignore_index: int = -100,
                              reduction: str = "mean") -> tuple[Any, Any]:
    """(loss, lse) of the vocabulary-parallel stages (gpuplan/ops/cross_entropy/partial.py)
    over column blocks [N, V_r] of one logits matrix, in one process: this function does the
    all-reduces (max, then sum) a communicator would do, on the host."""
    F = gp.functional
    device = gp.device_of(blocks[0])
    total = sum(b.shape[1] for b in blocks)
    starts = np.cumsum([0] + [b.shape[1] for b in blocks[:-1]]).tolist()
    m = np.maximum.reduce([gp.to_host(F.cross_entropy_partial_max(b)) for b in blocks])
    m = gp.to_device(m, device)
    stats = sum(gp.to_host(F.cross_entropy_partial(b, target, m, vocab_start=s,
                                                   vocab_total=total))
                for b, s in zip(blocks, starts, strict=True))
    return F.cross_entropy_finish(target, m, gp.to_device(stats, device), vocab_total=total,
                                  ignore_index=ignore_index, reduction=reduction)
