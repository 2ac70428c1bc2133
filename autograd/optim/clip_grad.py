"""Gradient clipping by the global L2 norm over all parameters (one norm launch)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import gpuplan as gp


def clip_grad_norm_(parameters: Iterable[Any] | Any, max_norm: float,
                    eps: float = 1e-6) -> float:
    """Scale every ``p.grad`` in place by ``max_norm / (total + eps)`` when that is below 1.

    ``total = sqrt(sum over parameters of sum(grad**2))`` (``gp.functional.global_l2_norm``,
    accumulated in f32, f64 for f64 gradients); returns ``total`` as a Python float
    (before clipping), like PyTorch's ``clip_grad_norm_``. Parameters without a gradient
    are skipped; with none at all the norm is 0.0.
    """
    if hasattr(parameters, "data") and hasattr(parameters, "grad"):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    total = float(gp.to_host(gp.functional.global_l2_norm([g.data for g in grads])))
    coef = float(max_norm) / (total + eps)
    if coef < 1.0:
        for g in grads:
            g.data[...] = gp.functional.unary("scale", g.data, alpha=coef)
    return total
