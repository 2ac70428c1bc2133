"""float64 references of the optimizer family: one PyTorch AdamW step and one PyTorch SGD step,
in textbook form."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan.testing import f64

__all__ = ["adamw_reference", "sgd_reference"]


def adamw_reference(p: Any, g: Any, m: Any, v: Any, *, lr: float, beta1: float, beta2: float,
                    eps: float, weight_decay: float, step: int) -> tuple[np.ndarray, ...]:
    """One PyTorch AdamW step (decoupled decay, bias corrections with `step` >= 1) in float64,
    textbook form: (param, exp_avg, exp_avg_sq) after the step."""
    p, g, m, v = (f64(x) for x in (p, g, m, v))
    p = p * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    mhat, vhat = m / (1 - beta1**step), v / (1 - beta2**step)
    return p - lr * mhat / (np.sqrt(vhat) + eps), m, v


def sgd_reference(p: Any, g: Any, buf: Any, *, lr: float, momentum: float = 0.0,
                  dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                  first_step: bool = False) -> tuple[np.ndarray, Any]:
    """One PyTorch SGD step (torch.optim.sgd._single_tensor_sgd) in float64: (param, momentum
    buffer); the buffer is ignored on the first step and stays None without momentum."""
    p, g = f64(p), f64(g)
    d = g + weight_decay * p
    if momentum:
        buf = d.copy() if first_step else momentum * f64(buf) + (1 - dampening) * d
        d = d + momentum * buf if nesterov else buf
    return p - lr * d, buf
