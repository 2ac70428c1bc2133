"""Loss Functions: cross entropy over class logits (PyTorch semantics) via the plans."""

from __future__ import annotations

from typing import Any

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor import Tensor
from gpuplan import backend

REDUCTIONS = ("mean", "sum", "none")


class CrossEntropy(Function):
    """loss over logits [N, V] and int targets [N]; lse [N] saved for backward.

    loss_n = lse_n - (1 - s) * x[n, t_n] - s / V * sum_v x[n, v] (s = label_smoothing);
    rows with t_n == ignore_index count 0 and are left out of the mean.
    """

    @staticmethod
    def forward(ctx, logits, target, ignore_index, reduction, label_smoothing):
        ctx.opts = dict(ignore_index=ignore_index, reduction=reduction,
                        label_smoothing=label_smoothing)
        loss, lse = F.cross_entropy(logits, target, **ctx.opts)
        ctx.save_for_backward(logits, target, lse)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        logits, target, lse = ctx.saved
        return F.cross_entropy_backward(logits, target, lse, dloss, **ctx.opts), None


def cross_entropy(input: Tensor, target: Any, ignore_index: int = -100,  # noqa: A002
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """PyTorch cross_entropy: input [N, C] (or [C], or [N, C, d1, ...] with classes on dim
    1), target of integer class indices with input's shape minus the class dim."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {REDUCTIONS}, "
                         f"given {reduction!r}")
    t = target.data if isinstance(target, Tensor) else gp.asarray(target, device=input.device)
    if t.dtype.kind not in "iu":
        raise ValueError(f"cross_entropy: target must hold integer class indices, given "
                         f"dtype {t.dtype}")
    opts = dict(ignore_index=int(ignore_index), reduction=reduction,
                label_smoothing=float(label_smoothing))
    if input.ndim == 1:
        out = CrossEntropy.apply(input.reshape(1, -1), t.reshape(1), **opts)
        return out.reshape(()) if reduction == "none" else out
    if input.ndim == 2:
        return CrossEntropy.apply(input, t.reshape(-1), **opts)
    # [N, C, d1, ...] -> [N * d1 * ..., C]
    perm = (0,) + tuple(range(2, input.ndim)) + (1,)
    flat = input.permute(*perm).reshape(-1, input.shape[1])
    out = CrossEntropy.apply(flat, backend.ascontiguous(t).reshape(-1), **opts)
    return out.reshape(t.shape) if reduction == "none" else out
