"""Adam (PyTorch semantics: weight decay as an L2 term added to the gradient) on the fused
AdamW plans."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import gpuplan.functional as F
from autograd.optim.adamw import AdamW


class Adam(AdamW):
    """PyTorch Adam.

    At step t (from 1): ``g = grad + wd * p``; ``m = b1 m + (1-b1) g``;
    ``v = b2 v + (1-b2) g^2``; ``p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``.
    The moment update is AdamW's fused plan with its decoupled decay off (``wd = 0`` there),
    so Adam with ``weight_decay=0`` is bit for bit AdamW with ``weight_decay=0``; a non-zero
    ``weight_decay`` forms ``g`` first with two plan calls per parameter (scale, add; on the
    f32 master copy for half parameters). ``amsgrad=True`` is not supported (refused).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, master_weights: bool = True,
                 foreach: bool = True) -> None:
        if amsgrad:
            raise ValueError("Adam: amsgrad=True is not supported (only amsgrad=False)")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         master_weights=master_weights, foreach=foreach)

    def _decoupled_decay(self, group: dict) -> float:
        return 0.0

    def _grad(self, group: dict, p: Any, target: Any) -> Any:
        g = p.grad.data
        wd = float(group["weight_decay"])
        if wd == 0.0:
            return g
        if g.dtype != target.dtype:
            g = F.cast(g, target.dtype)
        return F.binary("add", g, F.unary("scale", target, alpha=wd))
