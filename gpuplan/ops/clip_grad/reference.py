"""float64 reference of the clip_grad family: PyTorch's clip_grad_norm_ over a list of
gradients, by their global L2 norm (the reduction family's reference)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuplan.ops.reduction.reference import global_l2_norm_reference
from gpuplan.testing import f64

__all__ = ["clip_coefficient", "clip_grad_norm_reference"]


def clip_coefficient(norm: float, max_norm: float, eps: float = 1e-6) -> float:
    """torch.clamp(max_norm / (norm + eps), max=1): below 1 it scales the gradients, 1 leaves
    them unchanged; a NaN norm gives NaN (clamp propagates it), an infinite norm 0."""
    coef = max_norm / (norm + eps)
    return coef if math.isnan(coef) or coef < 1.0 else 1.0


def clip_grad_norm_reference(arrays: Sequence[Any], max_norm: float, eps: float = 1e-6,
                             total_norm: float | None = None
                             ) -> tuple[float, list[np.ndarray], float]:
    """torch.nn.utils.clip_grad_norm_ in float64: (norm, gradients after, coefficient).
    norm = total_norm when given, else sqrt of the sum of squares of every element
    (global_l2_norm_reference: NaN if any is NaN, else inf if any is infinite); every
    gradient is multiplied by clip_coefficient(norm, max_norm, eps) (so an infinite entry
    scaled by 0 becomes NaN), and is returned as it was when that is 1."""
    norm = global_l2_norm_reference(arrays) if total_norm is None else float(total_norm)
    coef = clip_coefficient(norm, max_norm, eps)
    with np.errstate(invalid="ignore"):
        grads = [f64(a) if coef == 1.0 else f64(a) * coef for a in arrays]
    return norm, grads, coef
