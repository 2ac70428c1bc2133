"""float64 references of the reduce_dim family from torch's definitions: max/min with indices
and top-k in torch's selection order, the corrected variance (and std) over axes, and the
gradient of a product along one dim, element by element."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpuplan.ops.reduction.reference import reduce_reference, reduced_axes
from gpuplan.testing import f64

__all__ = ["arg_select_reference", "prod_backward_reference", "selection_order",
           "topk_reference", "variance_reference"]


def selection_order(column: list[float], largest: bool) -> list[int]:
    """Positions of `column` in torch's selection order: NaN first (in index order), then
    the largest (`largest`) or smallest values, equal values by ascending index."""
    def key(j: int) -> tuple:
        v = column[j]
        if math.isnan(v):
            return (0, 0.0, j)
        return (1, -v if largest else v, j)
    return sorted(range(len(column)), key=key)


def topk_reference(x: Any, k: int, largest: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(values float64, indices int64) [outer, k, inner]: the first k of each column
    x[o, :, i] of x [outer, length, inner] in `selection_order`."""
    x = f64(x)
    outer, _, inner = x.shape
    values, indices = np.zeros((outer, k, inner)), np.zeros((outer, k, inner), np.int64)
    for o in range(outer):
        for i in range(inner):
            column = x[o, :, i].tolist()
            first = selection_order(column, largest)[:k]
            indices[o, :, i] = first
            values[o, :, i] = [column[j] for j in first]
    return values, indices


def arg_select_reference(op: str, x: Any) -> tuple[np.ndarray, np.ndarray]:
    """(values float64, indices int64) [outer, inner] of op ("max" or "min") over each
    column of x [outer, length, inner]: the first in `selection_order` (NaN wins for both,
    ties go to the lowest index)."""
    values, indices = topk_reference(x, 1, largest=op == "max")
    return values[:, 0, :], indices[:, 0, :]


def variance_reference(x: Any, axes: Any = None, keepdims: bool = False,
                       correction: float = 1.0, std: bool = False) -> np.ndarray:
    """sum((x - mean)^2) / max(0, n - correction) over `axes` (n elements each; axes and
    keepdims as in reduce_reference) in float64, two passes; with `std` its square root.
    n - correction <= 0 divides by 0 (inf, or NaN for 0 / 0), as torch."""
    x = f64(x)
    red = reduced_axes(x.ndim, axes)
    n = math.prod(x.shape[a] for a in red)
    mean = reduce_reference("mean", x, red, keepdims=True)
    squares = reduce_reference("sum", (x - mean) ** 2, red, keepdims)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = squares / np.float64(max(0.0, n - correction))
    return np.sqrt(v) if std else v


def prod_backward_reference(x: Any, dy: Any) -> np.ndarray:
    """dx [outer, length, inner] of y = prod(x, dim 1) for x [outer, length, inner]:
    dx[o, r, i] = dy[o, i] * prod_{r' != r} x[o, r', i], the product of the others taken
    literally (no division: exact where x has zeros)."""
    x, dy = f64(x), f64(dy)
    dx = np.zeros(x.shape)
    for o, r, i in np.ndindex(x.shape):
        others = [x[o, q, i] for q in range(x.shape[1]) if q != r]
        dx[o, r, i] = dy[o, i] * math.prod(others, start=1.0)
    return dx
